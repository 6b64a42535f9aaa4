"""Start-up of a draft network in the worker: load it, check it fits this engine, and make the
target's forward hand an EAGLE-3 head its aux hidden states. Refusals name the field."""

from __future__ import annotations

import sys

import torch

from ladle.attention.base import AttentionBackend
from ladle.config import EngineConfig
from ladle.model.arch_config import ModelArchConfig
from ladle.model.load_errors import ModelLoadError
from ladle.model.loader.draft_loading import load_draft_network
from ladle.worker.drafter import ModelDrafter
from ladle.worker.memory import module_bytes


def load_drafter(
    config: EngineConfig,
    target: torch.nn.Module,
    target_arch: ModelArchConfig,
    device: torch.device,
    dtype: torch.dtype,
    backend: AttentionBackend,
    max_model_len: int,
) -> ModelDrafter:
    spec = config.scheduler.speculative
    assert spec is not None and spec.model is not None
    parallel = config.parallel
    if parallel.tensor_parallel_size > 1 or parallel.pipeline_parallel_size > 1:
        raise ModelLoadError(
            f"speculative_config.method={spec.method!r} with a model: a draft network runs on "
            "one GPU for now; use tensor_parallel_size=1 and pipeline_parallel_size=1, or the "
            "model-free methods ngram / suffix"
        )
    network = load_draft_network(spec, config.model, target_arch, device, dtype, backend)
    if network.arch.max_position_embeddings < max_model_len:
        raise ModelLoadError(
            f"speculative_config.model={spec.model!r}: the draft model reaches "
            f"{network.arch.max_position_embeddings} positions, below max_model_len="
            f"{max_model_len}; lower max_model_len"
        )
    drafter = ModelDrafter(network, target, device, config.cache.block_size)
    if drafter.aux_layer_ids:
        target.model.aux_hidden_layers = drafter.aux_layer_ids
    print(
        f"[ladle] speculative decoding: {network.method} drafter {spec.model!r} "
        f"({drafter_bytes(drafter) / 2**20:.1f} MiB), k={spec.num_speculative_tokens}",
        file=sys.stderr,
        flush=True,
    )
    return drafter


def drafter_bytes(drafter: ModelDrafter | None) -> int:
    """The draft network's weights (0 without one); a shared embedding is the target's."""
    if drafter is None:
        return 0
    network = drafter.network
    module = network.model if network.model is not None else network.head
    total = module_bytes(module) if module is not None else 0
    head = network.head
    if head is not None:
        total += sum(
            w.numel() * w.element_size()
            for w in (head.embed_weight, head.lm_head_weight)
            if w is not None
        )
    return total
