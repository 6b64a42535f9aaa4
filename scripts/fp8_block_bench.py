"""Block-scaled fp8 layers (quant/fp8_block.py, 128 x 128 weight blocks, activations per group of
128) against per-channel fp8 (quant/fp8.py) and bfloat16, per projection of the 8B shape, from
decode to prefill sizes; and cuBLASLt's own block-scaled kernel (torch._scaled_mm with 1x128
activation and 128x128 weight scales, CUDA 12.9+ on Hopper) where this torch has it.

    python scripts/fp8_block_bench.py [--json out.json] [--tokens 1 64 1024]

Each case times whole layer calls (activation quantization included) back to back in one CUDA
graph, each call on its own weight (a ring larger than L2): us per call, median of 5 replays.
fp8_block is the layer as it runs (its own choice of GEMM); block_cublas and block_triton
force cuBLASLt's block-scaled GEMM (quant/fp8_block.block_scaled_mm) or the grouped Triton
tiles, so the choice can be checked against both.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from ladle.bench.gpu_timing import PROJECTIONS_8B, WEIGHT_RING_BYTES, calls_in_graph_us
from ladle.kernels.fp8_matmul import fp8_matmul, grouped_tile
from ladle.kernels.per_token_quant import per_group_quant
from ladle.model.layers.linear import Linear
from ladle.model.layers.quant.base import install_canonical_
from ladle.model.layers.quant.fp8 import Fp8Method
from ladle.model.layers.quant.fp8_block import Fp8BlockMethod, block_scaled_mm

TOKENS = (1, 16, 64, 128, 256, 1024, 4096)


def _layers(method, n: int, k: int, count: int) -> list:
    """`count` quantized layers [N, K] of random weights, or bf16 weight tensors (method None)."""
    layers = []
    for _ in range(count):
        weight = torch.randn(n, k, device="cuda") * 0.02
        if method is None:
            layers.append(weight.bfloat16())
            continue
        layer = Linear(k, n).cuda()
        install_canonical_(layer, method, method.quantize(weight))
        method.finalize(layer)
        layers.append(layer)
    return layers


def _forced_calls(layer: Linear, x: torch.Tensor) -> dict:
    """The block layer's two GEMMs forced, whichever the layer would pick: cuBLASLt's
    block-scaled one (where the layer has its scales) and the grouped Triton tiles."""
    calls = {}
    if layer.cublas_weight_scale is not None:
        calls["cublas"] = lambda: block_scaled_mm(x, layer.weight, layer.cublas_weight_scale)

    def triton_call():
        codes, scale = per_group_quant(x, torch.float8_e4m3fn, 128)
        tile = grouped_tile(x.shape[0], layer.output_size, 128)
        return fp8_matmul(codes, layer.weight, scale, layer.weight_scale, tile, grouped=True)

    calls["triton"] = triton_call
    return calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--shapes", nargs="+", default=list(PROJECTIONS_8B))
    args = parser.parse_args()
    results = []
    for shape_name in args.shapes:
        n, k = PROJECTIONS_8B[shape_name]
        count = max(2, WEIGHT_RING_BYTES // (n * k))
        layers = {
            "bf16": _layers(None, n, k, max(2, count // 2)),
            "fp8_channel": _layers(Fp8Method(), n, k, count),
            "fp8_block": _layers(Fp8BlockMethod(128, 128), n, k, count),
        }
        for tokens in args.tokens:
            x = torch.randn(tokens, k, device="cuda").bfloat16()
            row = {"shape": shape_name, "n": n, "k": k, "tokens": tokens}
            for name, ring in layers.items():
                if name == "bf16":
                    calls = [lambda w=weight, x=x: F.linear(x, w) for weight in ring]
                else:
                    calls = [lambda layer=layer, x=x: layer(x) for layer in ring]
                row[name + "_us"] = round(calls_in_graph_us(calls), 2)
            forced = [_forced_calls(layer, x) for layer in layers["fp8_block"]]
            for kernel in forced[0]:
                calls = [per_layer[kernel] for per_layer in forced]
                row[f"block_{kernel}_us"] = round(calls_in_graph_us(calls), 2)
            print(json.dumps(row), flush=True)
            results.append(row)
        del layers
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
