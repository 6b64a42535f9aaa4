"""int4 one-row matmuls (batch-1 decode) of the 8B shape: ladle's int4 GEMV over a sweep of
launch configurations, each read from HBM (a weight ring larger than the 50 MB L2, as a decode
step reads it), against the configuration the load-time plan picks (which times one weight, so
small layers sit in L2 while it measures).

    python scripts/int4_gemv_sweep.py [--tokens 1]

One JSON line per shape: the plan's pick and its us, the best configuration, us per call and
the packed weight's TB/s (int4 codes + float16 scales and zeros), and the top five.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch

from ladle.bench.gpu_timing import calls_in_graph_us
from ladle.kernels.int4_decode import Int4Kernel, int4_decode_matmul
from ladle.kernels.int4_matmul import int4_dequantize
from ladle.model.layers.quant.int4_plan import measure_plan

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
GROUP = 128


def configs(wide: bool) -> list[Int4Kernel]:
    """The one-row kernels (whole K per program) over tiles, and with --wide the split-K GEMV's
    launch configurations too."""
    listed = [
        Int4Kernel("row", block_n, warps, groups=groups)
        for block_n in (16, 32, 64, 128)
        for warps in (2, 4, 8)
        for groups in (1, 2, 4, 8)
        if block_n * groups * 16 >= warps * 32 * 2 and block_n * groups * 16 <= warps * 32 * 64
    ]
    if wide:
        for block_n, warps in ((32, 1), (64, 1), (64, 2), (128, 2), (128, 4), (256, 4), (256, 8)):
            for programs in (264, 528, 1056, 2112, 4224):
                for prefetch in (False, True):
                    listed.append(Int4Kernel("gemv", block_n, warps, programs, prefetch=prefetch))
    return listed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--wide", action="store_true")
    args = parser.parse_args()
    generator = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k) in SHAPES.items():
        words, groups = k // 8, k // GROUP
        weight_bytes = n * k // 2 + 2 * groups * n * 2
        ring = max(2, -(-150_000_000 // weight_bytes))
        calls = 24 if weight_bytes < 50_000_000 else 8
        packed = [
            torch.randint(
                -(2**31),
                2**31 - 1,
                (words, n),
                device="cuda",
                dtype=torch.int32,
                generator=generator,
            )
            for _ in range(ring)
        ]
        scales = [
            (torch.rand(groups, n, device="cuda", generator=generator) * 1e-2 + 1e-3).half()
            for _ in range(ring)
        ]
        zeros = [
            torch.randint(1, 16, (groups, n), device="cuda", generator=generator).half()
            for _ in range(ring)
        ]
        x = torch.randn(args.tokens, k, device="cuda", generator=generator).bfloat16()
        expected = x.float() @ int4_dequantize(
            packed[0], scales[0], zeros[0], GROUP, k, torch.float32
        )
        plan = measure_plan(packed[0], scales[0], zeros[0], GROUP, k)
        picked = plan.kernel_for(args.tokens)
        results = []
        for kernel in [picked, *configs(args.wide)]:
            if kernel is None:
                continue
            try:
                got = int4_decode_matmul(x, packed[0], scales[0], zeros[0], GROUP, kernel=kernel)
                error = ((got.float() - expected).norm() / expected.norm()).item()
                us = calls_in_graph_us(
                    [
                        functools.partial(
                            int4_decode_matmul,
                            x,
                            packed[i % ring],
                            scales[i % ring],
                            zeros[i % ring],
                            GROUP,
                            kernel=kernel,
                        )
                        for i in range(calls)
                    ],
                    replays=3,
                )
            except Exception as failure:  # noqa: BLE001
                results.append({"kernel": str(kernel), "error": str(failure)[:120]})
                continue
            results.append(
                {
                    "kernel": str(kernel),
                    "us": round(us, 2),
                    "tb_s": round(weight_bytes / us / 1e6, 3),
                    "rel_err": error,
                }
            )
        timed = sorted((r for r in results if "us" in r), key=lambda r: r["us"])
        print(
            json.dumps(
                {
                    "shape": name,
                    "tokens": args.tokens,
                    "plan_pick": results[0],
                    "best": timed[0],
                    "top5": timed[:5],
                    "plan_timings_l2": plan.timings_us.get(1),
                }
            ),
            flush=True,
        )
        del packed, scales, zeros
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
