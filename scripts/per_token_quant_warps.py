"""per_token_quant at the 8B's decode shapes (o's input 4096 wide, down's 14336) over a few warp
counts: us per call from a CUDA graph, inputs from a ring larger than L2 (as in a decode step,
where each layer's activation is fresh). Prints one JSON line per case.

    python scripts/per_token_quant_warps.py
"""

from __future__ import annotations

import functools
import json

import torch
import triton

from ladle.bench.gpu_timing import calls_in_graph_us, input_ring
from ladle.kernels.per_token_quant import _per_group_quant_kernel, quant_max


def launch(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, num_warps: int) -> None:
    block = triton.next_power_of_2(x.shape[1])
    # Per token: one group as wide as the row (per_token_quant's launch).
    _per_group_quant_kernel[(x.shape[0], 1)](
        codes,
        scale,
        x,
        x.stride(0),
        codes.stride(0),
        x.shape[1],
        1,
        QMAX=quant_max(torch.float8_e4m3fn),
        IS_INT=False,
        GROUP=block,
        num_warps=num_warps,
    )


def main() -> None:
    for rows in (64, 128, 256):
        for width in (4096, 14336):
            inputs = input_ring(rows, width)
            codes = torch.empty(rows, width, dtype=torch.float8_e4m3fn, device="cuda")
            scale = torch.empty(rows, 1, device="cuda")
            for num_warps in (2, 4, 8, 16, 32):
                calls = [
                    functools.partial(launch, inputs[i % len(inputs)], codes, scale, num_warps)
                    for i in range(24)
                ]
                us = calls_in_graph_us(calls)
                print(json.dumps({"rows": rows, "width": width, "warps": num_warps, "us": us}))


if __name__ == "__main__":
    main()
