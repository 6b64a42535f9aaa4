"""Build the engine core's StructuredOutputManager for a loaded model (None without a tokenizer).

The engine core loads its own copy of the tokenizer, lazily on the compile thread, because the
grammar's token masks must be computed where tokens are sampled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ladle.structured.grammar import GrammarCompiler
from ladle.structured.manager import StructuredOutputManager

if TYPE_CHECKING:
    from ladle.config import EngineConfig
    from ladle.worker.worker import WorkerInfo


def build_structured_output_manager(
    config: EngineConfig, info: WorkerInfo, device: torch.device
) -> StructuredOutputManager | None:
    """The grammar side of the engine core; device: where its masks are applied (the host's
    CPU when the workers run in other processes, which receive them as plain data)."""
    if config.model.skip_tokenizer_init:
        return None  # the front end refuses structured output before it gets here
    source = config.model.tokenizer or info.model_path
    if source is None:
        return None  # dummy weights of a preset: no tokenizer, so no grammar over its tokens
    arch = info.arch

    def load():
        from ladle.model.tokenizer import load_tokenizer

        return load_tokenizer(source, arch)

    return StructuredOutputManager(GrammarCompiler(load, arch.vocab_size), device)
