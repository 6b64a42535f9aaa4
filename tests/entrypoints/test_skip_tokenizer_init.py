"""vLLM's skip_tokenizer_init and SamplingParams(detokenize=False), offline.

A tiny llama folder with no tokenizer files at all runs with skip_tokenizer_init=True: token-id
prompts give the same greedy ids as the same weights with their tokenizer (the reference run),
with empty text; the end id comes from the model's config; everything that needs a tokenizer is
refused with an error naming the option, and the other requests of the batch still run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ladle import LLM, SamplingParams
from ladle.cli.engine_args import add_engine_arguments, engine_options_from_args
from ladle.entrypoints.llm import RequestErrors
from tests.entrypoints.conftest import TINY_ENGINE_OPTIONS
from tests.helpers.tiny_models import EOS_ID

PROMPTS = ["Hello, world!", "The quick brown fox jumps"]
MAX_TOKENS = 10
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors")


def copy_without_tokenizer(source: str, destination: Path) -> str:
    """The model's weights and configs only: no tokenizer.json, vocab, template."""
    destination.mkdir()
    for name in MODEL_FILES:
        shutil.copy(Path(source) / name, destination / name)
    return str(destination)


@pytest.fixture(scope="module")
def no_tokenizer_folder(tiny_model_path, tmp_path_factory) -> str:
    return copy_without_tokenizer(
        tiny_model_path("llama"), tmp_path_factory.mktemp("skiptok") / "llama"
    )


@pytest.fixture(scope="module")
def skip_llm(no_tokenizer_folder) -> LLM:
    return LLM(no_tokenizer_folder, skip_tokenizer_init=True, **TINY_ENGINE_OPTIONS)


def greedy(**extra) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, **extra)


def test_the_folder_has_no_tokenizer(no_tokenizer_folder):
    assert sorted(p.name for p in Path(no_tokenizer_folder).iterdir()) == sorted(MODEL_FILES)


def test_token_ids_in_same_ids_out_and_empty_text(skip_llm, offline_llm):
    assert skip_llm.tokenizer is None and skip_llm.get_tokenizer() is None
    prompt_ids = [offline_llm.tokenizer.encode(text) for text in PROMPTS]
    expected = offline_llm.generate(
        [{"prompt_token_ids": ids} for ids in prompt_ids], greedy(), use_tqdm=False
    )
    # Both spellings of a token prompt: vLLM's TokensPrompt dict and a bare id list.
    outputs = skip_llm.generate(
        [{"prompt_token_ids": prompt_ids[0]}, prompt_ids[1]], greedy(), use_tqdm=False
    )
    for output, reference, ids in zip(outputs, expected, prompt_ids, strict=True):
        assert output.prompt_token_ids == ids
        assert output.outputs[0].token_ids == reference.outputs[0].token_ids
        assert len(output.outputs[0].token_ids) == MAX_TOKENS
        assert reference.outputs[0].text != ""  # the reference did decode
        assert output.outputs[0].text == ""
        assert output.prompt is None


def test_stream_gives_ids_and_no_text(skip_llm, offline_llm):
    ids = offline_llm.tokenizer.encode(PROMPTS[0])
    expected = offline_llm.generate([ids], greedy(), use_tqdm=False)[0].outputs[0].token_ids
    streamed: list[int] = []
    for _, output in skip_llm.stream([ids], greedy()):
        assert output.outputs[0].text_delta == ""
        streamed += output.outputs[0].token_ids_delta
    assert streamed == expected


def test_end_id_comes_from_the_model_config(skip_llm):
    # The id every step is pushed to is the config's eos: the request ends there, as "stop".
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logit_bias={EOS_ID: 100.0})
    output = skip_llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0]
    assert output.token_ids == [EOS_ID]
    assert output.finish_reason == "stop"


@pytest.mark.parametrize(
    ("prompt", "params", "field"),
    [
        ("Hello", greedy(), "text prompts"),
        ({"prompt": "Hello"}, greedy(), "text prompts"),
        ([5, 6, 7], greedy(stop=["\n"]), "stop"),
        ([5, 6, 7], greedy(bad_words=["Hello"]), "bad_words"),
        ([5, 6, 7], greedy(structured_outputs={"choice": ["yes", "no"]}), "structured_outputs"),
    ],
)
def test_what_needs_a_tokenizer_is_refused_and_the_rest_runs(skip_llm, prompt, params, field):
    good = [9, 10, 11]
    alone = skip_llm.generate([good], greedy(), use_tqdm=False)[0].outputs[0].token_ids
    with pytest.raises(RequestErrors) as caught:
        skip_llm.generate([prompt, good], [params, greedy()], use_tqdm=False)
    message = str(caught.value)
    assert field in message and "skip_tokenizer_init" in message
    refused, served = caught.value.outputs
    assert refused.outputs[0].finish_reason == "error" and refused.error
    assert served.error is None and served.outputs[0].token_ids == alone
    assert not skip_llm.engine.has_unfinished_requests()


def test_chat_is_refused_naming_the_option(skip_llm):
    with pytest.raises(ValueError, match="chat.*skip_tokenizer_init"):
        skip_llm.chat([{"role": "user", "content": "hi"}], greedy(), use_tqdm=False)


def test_detokenize_false_keeps_ids_and_leaves_text_empty(offline_llm, monkeypatch):
    ids = offline_llm.tokenizer.encode(PROMPTS[1])
    decoded = offline_llm.generate([ids], greedy(), use_tqdm=False)[0].outputs[0]
    assert decoded.text != ""

    # No detokenization work at all for such a request: the detokenizer is never built.
    def no_detokenizer(*args, **kwargs):
        raise AssertionError("a detokenizer was built for detokenize=False")

    monkeypatch.setattr(
        "ladle.frontend.output_processor.IncrementalDetokenizer", no_detokenizer
    )
    plain = offline_llm.generate([ids], greedy(detokenize=False), use_tqdm=False)[0].outputs[0]
    assert plain.token_ids == decoded.token_ids
    assert plain.text == ""
    streamed: list[int] = []
    for _, output in offline_llm.stream([ids], greedy(detokenize=False)):
        assert output.outputs[0].text_delta == ""
        streamed += output.outputs[0].token_ids_delta
    assert streamed == decoded.token_ids


def test_detokenize_false_refuses_stop_strings():
    with pytest.raises(ValueError, match="stop strings need detokenize=True"):
        SamplingParams(detokenize=False, stop=["x"])


def test_cli_flag_reaches_the_engine_options():
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_options_from_args(parser.parse_args(["--skip-tokenizer-init"]))[
        "skip_tokenizer_init"
    ] is True


@pytest.mark.parametrize(
    "flag", ["--tokenizer", "--chat-template", "--tool-call-parser", "--reasoning-parser"]
)
def test_serve_refuses_tokenizer_flags_at_start_up(flag):
    import argparse

    from ladle.cli.serve import _check_no_tokenizer_flags

    values = {"tokenizer": None, "chat_template": None, "tool_call_parser": None,
              "reasoning_parser": None}
    values[flag.removeprefix("--").replace("-", "_")] = "x"
    with pytest.raises(ValueError, match=f"{flag} needs a tokenizer.*--skip-tokenizer-init"):
        _check_no_tokenizer_flags(argparse.Namespace(**values))
    values[flag.removeprefix("--").replace("-", "_")] = None
    _check_no_tokenizer_flags(argparse.Namespace(**values))  # none given: starts
