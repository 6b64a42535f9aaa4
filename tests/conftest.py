"""Session-wide fixtures. The tiny model fixtures are documented in tests/helpers/tiny_models.py:
tiny_model_path(architecture="llama", sharded=False) -> str, and tiny_tokenizer."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from helpers.tiny_models import build_tiny_tokenizer, save_tiny_model


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """Factory: tiny_model_path("qwen3") -> a saved tiny HF model folder, built once a session."""
    root = tmp_path_factory.mktemp("tiny_models")
    cache: dict[tuple[str, bool], str] = {}

    def get(architecture: str = "llama", sharded: bool = False) -> str:
        key = (architecture, sharded)
        if key not in cache:
            cache[key] = save_tiny_model(root, architecture, sharded=sharded)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The byte-level BPE tokenizer saved beside every tiny model."""
    return build_tiny_tokenizer()
