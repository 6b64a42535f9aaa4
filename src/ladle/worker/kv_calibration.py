"""Per-layer float8 KV cache scales from a calibration pass at start-up.

When the checkpoint carries no `k_scale`/`v_scale` (model/layers/kv_scales.py), set_fp8_kv_scales
runs one real prefill step (ModelRunner.execute, a temporary cache in the model's dtype) over
NUM_PROMPTS prompts of PROMPT_LEN token ids drawn from the vocabulary with a fixed seed, records
each attention layer's largest |key| and |value|, and sets

    k_scale = HEADROOM * amax(|key|) / 448   (and v_scale alike)

so the observed range fills e4m3's range with room for larger values in real prompts: values
beyond it saturate at +-448 * scale. The headroom costs almost no precision: e4m3's relative
step is the same (1/16) over its whole normal range, and only values below amax / 14336 fall
into subnormals.

Random token ids, not text: the runner has no tokenizer, and the large key channels that set
the scale come from the projection weights and rotary positions more than from the tokens
(docs/quantization.md measures the logits' error this gives on the default model's real text).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

from ladle.attention.kv_quant import FP8_E4M3_MAX, check_kv_scale
from ladle.model.layers.attention import Attention
from ladle.protocol.step import StepPlan
from ladle.sampling.params import SamplingParams
from ladle.worker.dummy_batch import prefill_plan

if TYPE_CHECKING:
    from ladle.worker.model_runner import ModelRunner

NUM_PROMPTS = 4
PROMPT_LEN = 128
HEADROOM = 2.0
SEED = 0


def attention_layers(model: nn.Module) -> list[Attention]:
    return [module for module in model.modules() if isinstance(module, Attention)]


def build_calibration_step(
    vocab_size: int, block_size: int, prompt_len: int, num_prompts: int = NUM_PROMPTS
) -> tuple[StepPlan, int]:
    """One prefill step of num_prompts seeded random prompts, each with blocks of its own
    (1..: block 0 stays the null block). Returns the step and the number of blocks the
    temporary cache needs."""
    rng = random.Random(SEED)
    prompts: list[list[int]] = []
    block_ids: list[list[int]] = []
    next_block = 1
    for _ in range(num_prompts):
        prompts.append([rng.randrange(vocab_size) for _ in range(prompt_len)])
        num_blocks = -(-prompt_len // block_size)
        block_ids.append(list(range(next_block, next_block + num_blocks)))
        next_block += num_blocks
    params = SamplingParams(temperature=0.0, max_tokens=1)
    return prefill_plan(prompts, block_ids, params, "__kv_calibration_"), next_block


@contextmanager
def recording_kv_amax(layers: list[Attention]) -> Iterator[list[list[torch.Tensor]]]:
    """While open, every forward of `layers` folds max |key| and max |value| into
    amaxes[layer] = [key_amax, value_amax] (device tensors: no host sync per layer)."""
    amaxes = [[torch.zeros((), device=layer.k_scale.device) for _ in range(2)] for layer in layers]

    def hook_for(index: int):
        def record(_module: nn.Module, args: tuple) -> None:
            key, value = args[1], args[2]
            for slot, tensor in enumerate((key, value)):
                amaxes[index][slot] = torch.maximum(
                    amaxes[index][slot], tensor.abs().amax().float()
                )

        return record

    handles = [layer.register_forward_pre_hook(hook_for(i)) for i, layer in enumerate(layers)]
    try:
        yield amaxes
    finally:
        for handle in handles:
            handle.remove()


def set_scales_from_amax(layers: list[Attention], amaxes: list[list[torch.Tensor]]) -> None:
    """k/v scale = HEADROOM * amax / 448 per layer (a layer that saw only zeros keeps 1.0)."""
    for index, (layer, (key_amax, value_amax)) in enumerate(zip(layers, amaxes, strict=True)):
        for name, amax in (("k_scale", key_amax), ("v_scale", value_amax)):
            value = float(amax)
            scale = HEADROOM * value / FP8_E4M3_MAX if value > 0.0 else 1.0
            check_kv_scale(f"layer {index} {name} (calibrated, amax {value})", torch.tensor(scale))
            getattr(layer, name).fill_(scale)
        layer.kv_scales_source = "calibration"


@torch.inference_mode()
def set_fp8_kv_scales(
    runner: ModelRunner,
    vocab_size: int,
    max_model_len: int,
    allocate_kv_caches: Callable[[int, torch.dtype], list[torch.Tensor]],
    dtype: torch.dtype,
    combine_amax: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """Give every attention layer of the runner's model its fp8 KV scales: those its checkpoint
    carried, else one calibration step through the real step path (ModelRunner.execute) over a
    temporary cache of `dtype` (the model's) from allocate_kv_caches(num_blocks, dtype). Runs
    before the KV cache is sized; says what it did. combine_amax: the largest over the
    tensor-parallel ranks of each layer's [key, value] amax (each rank sees only its heads), so
    every rank gets the one-GPU scales."""
    layers = attention_layers(runner.model)
    uncalibrated = [layer for layer in layers if layer.kv_scales_source != "checkpoint"]
    note = f"{len(layers) - len(uncalibrated)} layers' k/v scales from the checkpoint"
    if uncalibrated:
        prompt_len = max(1, min(PROMPT_LEN, max_model_len - 1))
        step, num_blocks = build_calibration_step(vocab_size, runner.block_size, prompt_len)
        real_caches = runner.kv_caches
        runner.kv_caches = allocate_kv_caches(num_blocks, dtype)
        try:
            with recording_kv_amax(uncalibrated) as amaxes:
                runner.execute(step).result()
        finally:
            runner.kv_caches = real_caches
            runner.forget(step.request_ids())
            runner.batch.clear_block_tables()
        if combine_amax is not None:
            combined = combine_amax(torch.stack([torch.stack(pair) for pair in amaxes]))
            amaxes = [[combined[i, 0], combined[i, 1]] for i in range(len(amaxes))]
        set_scales_from_amax(uncalibrated, amaxes)
        note += (
            f", {len(uncalibrated)} calibrated on {NUM_PROMPTS} prompts x {prompt_len} seeded "
            f"random token ids (scale = {HEADROOM:g} x amax / 448)"
        )
    k_scales = [float(layer.k_scale) for layer in layers]
    v_scales = [float(layer.v_scale) for layer in layers]
    print(
        f"[ladle] fp8 KV cache: {note}; k_scale {min(k_scales):.4g}-{max(k_scales):.4g}, "
        f"v_scale {min(v_scales):.4g}-{max(v_scales):.4g}",
        file=sys.stderr,
        flush=True,
    )
