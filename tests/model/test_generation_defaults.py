"""The model's generation_config.json supplies request defaults (vLLM's --generation-config
auto), offline and on the server; 'vllm' turns it off; a request's own value always wins, except
that its max_new_tokens caps a served request's max_tokens (tests/entrypoints/
test_serve_generation_config.py checks that on a real server)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ladle import LLM, SamplingParams
from ladle.config import ModelConfig
from ladle.entrypoints.openai.protocol import CompletionRequest
from ladle.entrypoints.openai.sampling import build_sampling_params
from ladle.model.generation_defaults import read_generation_defaults, sampling_defaults_of


@pytest.fixture(scope="module")
def model_with_generation_config(tiny_model_path, tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("genconfig") / "model"
    shutil.copytree(tiny_model_path("llama"), folder)
    (folder / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20})
    )
    return str(folder)


def test_reads_the_sampling_fields(model_with_generation_config) -> None:
    defaults = read_generation_defaults(model_with_generation_config, "auto")
    assert defaults == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert read_generation_defaults(model_with_generation_config, "vllm") == {}


def test_greedy_generation_config_supplies_nothing(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"do_sample": False, "temperature": 0.6})
    )
    assert read_generation_defaults(str(tmp_path), "auto") == {}


def test_bad_generation_config_value_is_named() -> None:
    with pytest.raises(ValueError, match="generation_config 'nowhere'"):
        ModelConfig(generation_config="nowhere")


def test_offline_defaults_apply_only_when_params_are_not_given(
    model_with_generation_config, capsys
) -> None:
    llm = LLM(model_with_generation_config, num_kv_blocks=32)
    assert "temperature=0.6" in capsys.readouterr().out
    default = llm.get_default_sampling_params()
    assert (default.temperature, default.top_p, default.top_k) == (0.6, 0.95, 20)
    off = LLM(model_with_generation_config, num_kv_blocks=32, generation_config="vllm")
    assert off.get_default_sampling_params().temperature == 1.0


def test_generate_without_params_samples_with_the_defaults(tiny_model_path, tmp_path) -> None:
    # top_k=1 makes sampling greedy: observable proof that generate(None) used the defaults.
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path("llama"), folder)
    (folder / "generation_config.json").write_text(json.dumps({"top_k": 1, "temperature": 1.0}))
    llm = LLM(str(folder), num_kv_blocks=32)
    prompts = ["hello world", "the cat sat"]
    from_defaults = llm.generate(prompts, None, use_tqdm=False)
    greedy = llm.generate(prompts, SamplingParams(temperature=0.0), use_tqdm=False)
    for got, want in zip(from_defaults, greedy):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids


def test_server_request_fields_win_over_defaults() -> None:
    defaults = {"temperature": 0.6, "top_k": 20}
    unset = CompletionRequest.model_validate({"prompt": "x"})
    params = build_sampling_params(unset, 4, None, defaults=defaults)
    assert (params.temperature, params.top_k, params.top_p) == (0.6, 20, 1.0)
    explicit = CompletionRequest.model_validate({"prompt": "x", "temperature": 0.0})
    assert build_sampling_params(explicit, 4, None, defaults=defaults).temperature == 0.0


# ----- max_new_tokens: vLLM's default (and, served, ceiling) of max_tokens -----------------------


def _write_config(folder: Path, config: dict) -> str:
    (folder / "generation_config.json").write_text(json.dumps(config))
    return str(folder)


def test_max_new_tokens_becomes_max_tokens(tmp_path: Path) -> None:
    folder = _write_config(tmp_path, {"do_sample": True, "top_k": 20, "max_new_tokens": 7})
    assert read_generation_defaults(folder, "auto") == {"top_k": 20, "max_tokens": 7}
    # A --generation-config folder is read the same way; 'vllm' ignores it as the other keys.
    assert read_generation_defaults("elsewhere", folder) == {"top_k": 20, "max_tokens": 7}
    assert read_generation_defaults(folder, "vllm") == {}
    # The override's max_new_tokens wins over the model's, as every override key does.
    assert sampling_defaults_of(folder, "auto", {"max_new_tokens": 9})["max_tokens"] == 9


def test_greedy_generation_config_keeps_its_length(tmp_path: Path) -> None:
    # transformers honours max_new_tokens under greedy decoding; only the sampling fields go.
    folder = _write_config(tmp_path, {"do_sample": False, "temperature": 0.6, "max_new_tokens": 5})
    assert read_generation_defaults(folder, "auto") == {"max_tokens": 5}


@pytest.mark.parametrize("value", [0, -3, 2.5, "12", True, None, [4]])
def test_a_max_new_tokens_that_is_no_count_is_left_out(tmp_path: Path, value) -> None:
    folder = _write_config(tmp_path, {"temperature": 0.6, "max_new_tokens": value})
    assert read_generation_defaults(folder, "auto") == {"temperature": 0.6}


def test_integral_float_max_new_tokens_is_an_int(tmp_path: Path) -> None:
    folder = _write_config(tmp_path, {"max_new_tokens": 12.0})
    assert read_generation_defaults(folder, "auto") == {"max_tokens": 12}
    assert isinstance(read_generation_defaults(folder, "auto")["max_tokens"], int)


def test_offline_generate_without_params_stops_at_max_new_tokens(
    tiny_model_path, tmp_path, capsys
) -> None:
    """As vLLM's LLM: get_default_sampling_params() carries it, generate(prompts) stops there;
    params given explicitly are the caller's own (vLLM caps only served requests)."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path("llama"), folder)
    # top_k=1: greedy, so the default run can be compared with explicit greedy ones.
    _write_config(folder, {"top_k": 1, "max_new_tokens": 3})
    llm = LLM(str(folder), num_kv_blocks=32)
    assert "max_tokens=3" in capsys.readouterr().out
    assert llm.get_default_sampling_params().max_tokens == 3
    prompts = ["hello world", "the cat sat"]
    from_defaults = llm.generate(prompts, None, use_tqdm=False)
    longer = llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False
    )
    for got, want in zip(from_defaults, longer):
        assert len(want.outputs[0].token_ids) == 8  # explicit params are not capped offline
        generated = got.outputs[0].token_ids
        # 3 tokens, the greedy run's first 3 (fewer only if the model ended the text sooner)
        assert generated == want.outputs[0].token_ids[: len(generated)]
        assert len(generated) == 3 or got.outputs[0].finish_reason == "stop"
        if len(generated) == 3:
            assert got.outputs[0].finish_reason == "length"
    off = LLM(str(folder), num_kv_blocks=32, generation_config="vllm")
    # ladle's own default, as vLLM's SamplingParams (16)
    assert off.get_default_sampling_params().max_tokens == SamplingParams().max_tokens
