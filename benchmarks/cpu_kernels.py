"""The CPU weight formats' matmuls side by side, interleaved in one run (medians of --repeats).

    PYTHONPATH=src python benchmarks/cpu_kernels.py --threads 1 --repeats 5

For each shape of the default model's layers and batch 1 and 32: float32 (MKL), int8 weight-only
(codes converted to float32 per chunk, then MKL), int8 x int8 on torch's quantized engine with
per-token activation scales (ladle's CPU int8), int4 group 128 dequantized per chunk then MKL
(ladle's CPU int4), and torch's `_weight_int4pack_mm_for_cpu` (group 64: it refuses a K that
is not a multiple of the group, and 576 = 4.5 x 128). --num-weights distinct random weights per
sweep, so they do not all sit in cache as one would.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ladle.model.layers.cpu_int8_gemm import int8_dynamic_linear, pack_int8_weight
from ladle.model.layers.group_quant import group_quantized_matmul, quantize_int4_groups
from ladle.model.layers.quantized_linear import int8_weight_matmul, quantize_int8_per_row

SHAPES = [(1536, 576), (576, 1536), (960, 576)]  # gate (of gate_up), down, qkv


def torch_int4pack(weight: torch.Tensor, group_size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """torch's packed CPU int4 matmul on the same RTN group quantization."""
    rows = quantize_int4_groups(weight, group_size)
    codes = torch.cat((rows.codes & 0x0F, rows.codes >> 4), dim=1)[:, : weight.shape[1]]
    packed = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    # torch's form: w = (code - 8) * scale + zero, so zero = offset + 8 * scale.
    scale_and_zero = torch.stack((rows.scale, rows.offset + 8 * rows.scale), dim=-1)
    scale_and_zero = scale_and_zero.transpose(0, 1).contiguous()
    return lambda x: torch._weight_int4pack_mm_for_cpu(x, packed, group_size, scale_and_zero)


def kernels(weight: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    codes, scale = quantize_int8_per_row(weight)
    packed = pack_int8_weight(codes, scale)
    int4 = quantize_int4_groups(weight, 128)
    return {
        "float32": lambda x: F.linear(x, weight),
        "int8 weight-only": lambda x: int8_weight_matmul(x, codes, scale),
        "int8 x int8 (engine)": lambda x: int8_dynamic_linear(x, packed),
        "int4 g128 chunked": lambda x: group_quantized_matmul(x, int4),
        # torch's kernel refuses K not divisible by the group (576 = 4.5 x 128): group 64.
        "int4 g64 _weight_int4pack_mm_for_cpu": torch_int4pack(weight, 64),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-weights", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    for num_rows, num_columns in SHAPES:
        weights = [
            torch.randn(num_rows, num_columns, generator=generator) * 0.02
            for _ in range(args.num_weights)
        ]
        per_weight = [kernels(weight) for weight in weights]
        for batch in (1, 32):
            x = torch.randn(batch, num_columns, generator=generator)
            times: dict[str, list[float]] = {name: [] for name in per_weight[0]}
            for _ in range(args.repeats):
                for name in times:  # interleaved: every kernel once per repeat
                    started = time.perf_counter()
                    for functions in per_weight:
                        functions[name](x)
                    times[name].append((time.perf_counter() - started) / len(per_weight))
            cells = ", ".join(
                f"{name} {statistics.median(samples) * 1e6:.0f}" for name, samples in times.items()
            )
            print(f"[{num_rows}, {num_columns}] batch {batch}: {cells} (us)", flush=True)


if __name__ == "__main__":
    main()
