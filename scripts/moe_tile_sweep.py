"""The fused MoE tuner's view of one layer of a preset's shape (issue 35): every candidate tile
timed per token-count bucket on this GPU, the plan it keeps, and for that plan the bandwidth the
step's expert reads reach.

    python scripts/moe_tile_sweep.py [--preset qwen3-30b-a3b] [--max-tokens 16] [--fp8]
        [--json out.json]

Random weights (std 0.02) of the preset's expert stacks on the GPU, timed by the start-up tuner
itself (kernels/moe_tuning.py, a fresh cache directory, so nothing is read back). Bandwidth
counts the bytes of the distinct experts a bucket's routing reads (expected distinct experts
E (1 - (1 - k / E)^T) for T tokens), over the chosen plan's time.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from ladle.kernels.moe_tiles import ExpertStacks
from ladle.kernels.moe_tuning import tune_tile_table
from ladle.model.layers.quant.fp8 import quantize_fp8_per_row
from ladle.model.loader.presets import PRESETS


def _moe_shape(preset: str) -> tuple[int, int, int, int]:
    """(experts, hidden, expert width, top_k) of a preset's config."""
    config = PRESETS[preset]
    experts = config.get("num_experts", config.get("num_local_experts"))
    width = config.get("moe_intermediate_size", config["intermediate_size"])
    return experts, config["hidden_size"], width, config["num_experts_per_tok"]


def _stacks(experts: int, hidden: int, width: int, fp8: bool) -> ExpertStacks:
    generator = torch.Generator(device="cuda").manual_seed(0)
    gate_up = torch.empty(experts, 2 * width, hidden, device="cuda", dtype=torch.bfloat16)
    down = torch.empty(experts, hidden, width, device="cuda", dtype=torch.bfloat16)
    for stack in (gate_up, down):
        stack.normal_(0.0, 0.02, generator=generator)
    if not fp8:
        return ExpertStacks(gate_up, down)
    quantized = []
    for stack in (gate_up, down):
        codes, scale = quantize_fp8_per_row(stack.reshape(-1, stack.shape[-1]))
        quantized += [codes.reshape(stack.shape), scale.reshape(stack.shape[:2])]
    return ExpertStacks(quantized[0], quantized[2], quantized[1], quantized[3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen3-30b-a3b")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--fp8", action="store_true", help="fp8 experts, per-channel scales")
    parser.add_argument("--json", type=Path, help="also write the timings here")
    args = parser.parse_args()
    experts, hidden, width, top_k = _moe_shape(args.preset)
    stacks = _stacks(experts, hidden, width, args.fp8)
    bytes_per_expert = 3 * hidden * width * stacks.gate_up.element_size()
    with tempfile.TemporaryDirectory() as cache:
        result = tune_tile_table(stacks, top_k, torch.bfloat16, args.max_tokens,
                                 cache_dir=Path(cache))  # fmt: skip
    print(f"{torch.cuda.get_device_name()} {args.preset} experts={experts} hidden={hidden} "
          f"width={width} top_k={top_k} {'fp8' if args.fp8 else 'bf16'}: tuned in "
          f"{result.seconds:.1f} s")  # fmt: skip
    for bucket, plan in zip(result.table.buckets, result.table.plans, strict=True):
        timings = result.timings[bucket]
        chosen_us = timings["chosen"] * 1e6
        read = experts * (1 - (1 - top_k / experts) ** bucket) * bytes_per_expert
        terabytes_per_s = read / timings["chosen"] / 1e12
        print(f"{bucket:5d} tokens: {chosen_us:8.1f} us, {terabytes_per_s:5.2f} TB/s | gate-up "
              f"{plan.gate_up.describe()} | down {plan.down.describe()}")  # fmt: skip
    if args.json:
        record = {str(b): {k: v * 1e6 for k, v in t.items()} for b, t in result.timings.items()}
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
