"""The front's tokenizer for prefix keys is the one the replicas run with, found without a hub
lookup of a preset's name (an offline GPU machine spent ~25 s per start retrying it)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from ladle.config import EngineConfig  # noqa: E402
from ladle.engine.tokenizer_source import resolve_tokenizer_source  # noqa: E402
from ladle.entrypoints.cluster.app import routing_tokenizer_source  # noqa: E402


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
