"""Which tokenizer a model runs with: the one named (`tokenizer=` / `--tokenizer`), else the
model's own, else, for random weights of a preset shape, the default model's.

Random weights have no tokenizer of their own, but a user trying a preset wants text prompts,
chat and the server to work as they do for a real model; the default model's tokenizer is
already on disk (or fetched once). Ids the preset's larger vocabulary can sample beyond that
tokenizer's decode to no text (the detokenizer skips ids it does not know).
"""

from __future__ import annotations

import sys

from ladle.config import ModelConfig


def resolve_tokenizer_source(model_config: ModelConfig, model_path: str | None) -> str | None:
    """The folder, hub id or .gguf file to load the tokenizer from (None: run without one)."""
    if model_config.skip_tokenizer_init:
        return None  # asked for: token ids in and out, nothing to load
    if model_config.tokenizer:
        return model_config.tokenizer
    if model_path is not None:
        return model_path
    if model_config.load_format == "dummy":
        from ladle.model.default_model import DefaultModelUnavailableError, resolve_default_model

        try:
            return str(resolve_default_model())
        except DefaultModelUnavailableError as error:
            # Token-id prompts (benchmarks, offline machines) need no tokenizer: run without one
            # and say why; a text prompt then gets "this model has no tokenizer".
            print(
                "[ladle] random weights run without a tokenizer (token-id prompts only): the "
                f"default model's tokenizer is not available ({str(error).splitlines()[0]}); "
                "name one with --tokenizer",
                file=sys.stderr,
                flush=True,
            )
            return None
    return None
