"""TextTokenizer: the real SmolLM2 GGUF tokenizer (converted once, then cached), its chat template
and end-of-turn ids, Hugging Face folders, and the errors on bad chat messages."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from helpers.tiny_models import EOS_ID, IM_START_ID, build_tiny_tokenizer

from ladle.model.default_model import resolve_default_model
from ladle.model.loader.errors import ModelLoadError
from ladle.model.tokenizer import (
    TextTokenizer,
    gguf_tokenizer_cache_folder,
    load_tokenizer,
)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
IM_START, IM_END = 1, 2  # SmolLM2's ChatML ids


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return resolve_default_model(show_progress=False)


@pytest.fixture(scope="module")
def tokenizer_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A private cache, so the first load really converts the GGUF vocabulary.
    return tmp_path_factory.mktemp("tokenizer_cache")


@pytest.fixture(scope="module")
def cold(gguf_path: Path, tokenizer_cache: Path) -> TextTokenizer:
    """Built from the GGUF by transformers itself: the reference for the cached copy."""
    return load_tokenizer(str(gguf_path), cache_dir=tokenizer_cache)


@pytest.fixture(scope="module")
def warm(
    gguf_path: Path, tokenizer_cache: Path, cold: TextTokenizer
) -> tuple[TextTokenizer, float]:
    started = time.perf_counter()
    tokenizer = load_tokenizer(str(gguf_path), cache_dir=tokenizer_cache)
    return tokenizer, time.perf_counter() - started


def test_second_load_comes_from_the_cache(gguf_path: Path, tokenizer_cache: Path, warm) -> None:
    _, seconds = warm
    assert seconds < 3.0  # the conversion takes ~10 s; the cached folder loads in well under 1
    folder = gguf_tokenizer_cache_folder(gguf_path, tokenizer_cache)
    assert (folder / "tokenizer.json").is_file()
    # Nothing half-written is left beside it.
    assert [entry.name for entry in folder.parent.iterdir()] == [folder.name]


def test_chat_template_matches_hf(cold: TextTokenizer, warm) -> None:
    tokenizer, _ = warm
    reference = cold.hf_tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    reference_ids = list(getattr(reference, "input_ids", None) or reference)
    ids = tokenizer.apply_chat_template(QUESTION)
    assert ids == reference_ids
    assert cold.apply_chat_template(QUESTION) == reference_ids
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    without_prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=False)
    assert without_prompt == ids[: len(without_prompt)] and len(without_prompt) < len(ids)


def test_end_of_turn_is_im_end_not_im_start(cold: TextTokenizer, warm) -> None:
    tokenizer, _ = warm
    for candidate in (cold, tokenizer):
        assert IM_END in candidate.eos_token_ids
        assert IM_START not in candidate.eos_token_ids
    assert tokenizer.eos_token_ids == cold.eos_token_ids


def test_round_trip_and_sizes(warm) -> None:
    tokenizer, _ = warm
    text = "Paged attention keeps KV blocks; héllo wörld 123!"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode(text, add_special_tokens=False) == ids  # SmolLM2 adds no bos
    assert tokenizer.vocab_size == 49152
    assert 0 in tokenizer.all_special_ids
    with_end = ids + [IM_END]
    assert tokenizer.decode(with_end) == text
    assert tokenizer.decode(with_end, skip_special_tokens=False) == text + "<|im_end|>"


@pytest.mark.parametrize(
    "messages, problem",
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        (["hello"], r"messages\[0\] must be a dict"),
        ([{"role": "wizard", "content": "hi"}], "role 'wizard'"),
        ([{"role": "user", "content": 5}], "content must be a string"),
        ([{"role": "user"}], "content must be a string"),
        ([{"role": "user", "content": "hi"}, {"content": "x"}], r"messages\[1\] has role None"),
    ],
)
def test_malformed_messages_are_value_errors(warm, messages, problem: str) -> None:
    tokenizer, _ = warm
    with pytest.raises(ValueError, match=problem):
        tokenizer.apply_chat_template(messages)


def test_no_chat_template_is_a_value_error() -> None:
    hf_tokenizer = build_tiny_tokenizer()
    hf_tokenizer.chat_template = None
    tokenizer = TextTokenizer(hf_tokenizer)
    assert not tokenizer.has_chat_template
    with pytest.raises(ValueError, match="no chat template"):
        tokenizer.apply_chat_template(QUESTION)


def test_hf_folder_with_generation_config_eos(tiny_model_path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path("llama"), folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS_ID, 7]}))
    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.eos_token_ids[:2] == (EOS_ID, 7)
    assert IM_START_ID not in tokenizer.eos_token_ids
    ids = tokenizer.apply_chat_template(QUESTION)
    assert ids[-1] == tokenizer.encode("\n", add_special_tokens=False)[-1]
    assert tokenizer.decode(tokenizer.encode("Hello, world!")) == "Hello, world!"


def test_missing_paths_are_model_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="nothing.gguf"):
        load_tokenizer(str(tmp_path / "nothing.gguf"), cache_dir=tmp_path)
    with pytest.raises(ModelLoadError, match="no-such-folder"):
        load_tokenizer(str(tmp_path / "no-such-folder"))
