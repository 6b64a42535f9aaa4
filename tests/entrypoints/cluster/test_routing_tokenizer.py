"""The front's tokenizer for prefix keys is the one the replicas run with, found without a hub
lookup of a preset's name (an offline GPU machine spent ~25 s per start retrying it)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from ladle.config import EngineConfig  # noqa: E402
from ladle.entrypoints.cluster.app import routing_tokenizer_source  # noqa: E402
from ladle.frontend.tokenizer_source import resolve_tokenizer_source  # noqa: E402


def _source(**options):
    config = EngineConfig.from_kwargs(**options)
    return routing_tokenizer_source(config, options.get("model"))


def test_a_dummy_preset_routes_with_the_engines_tokenizer_not_its_name():
    options = {"model": "tiny-llama", "load_format": "dummy", "device": "cpu"}
    source = _source(**options)
    assert source != "tiny-llama"
    assert source == resolve_tokenizer_source(EngineConfig.from_kwargs(**options).model, None)


def test_a_named_tokenizer_and_a_model_folder_are_used_as_given(tmp_path):
    options = {"model": "tiny-llama", "load_format": "dummy", "device": "cpu"}
    assert _source(**options, tokenizer=str(tmp_path)) == str(tmp_path)
    assert routing_tokenizer_source(EngineConfig.from_kwargs(**options), str(tmp_path)) == str(
        tmp_path
    )


def test_keys_from_the_start_of_a_text_prompt_equal_keys_from_all_of_it():
    """The front encodes only the start of a text prompt (its first blocks are all the key
    needs); the key must be the one the full encoding gives, whatever the text does at the
    cut (long words, digits, spaces, other scripts), for chat and plain prompts."""
    import json
    import random

    from ladle.entrypoints.cluster.prefix_routing import prefix_routing_key
    from ladle.entrypoints.cluster.routing_keys import prompt_token_ids, request_routing_key
    from ladle.model.default_model import resolve_default_model
    from ladle.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(resolve_default_model(show_progress=False)))
    rng = random.Random(0)
    pieces = [
        "word ",
        "supercalifragilistic",
        "1234567890",
        "   ",
        "\n\n",
        "ünïcödé ",
        "猫が",
        "!?",
    ]
    for length in (3, 40, 150, 400, 2000):
        text = "".join(rng.choice(pieces) for _ in range(length))
        chat = {
            "messages": [{"role": "system", "content": text}, {"role": "user", "content": "hi"}]
        }
        for path, body in (("/v1/chat/completions", chat), ("/v1/completions", {"prompt": text})):
            raw = json.dumps(body).encode()
            full = prompt_token_ids(path, raw, tokenizer)
            leading = prompt_token_ids(path, raw, tokenizer, 64)
            assert leading == full[:64], (path, length)
            assert request_routing_key(path, raw, tokenizer, 16, 4) == prefix_routing_key(
                full, 16, 4
            )
