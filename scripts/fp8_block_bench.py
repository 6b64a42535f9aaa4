"""Block-scaled fp8 layers (quant/fp8_block.py, 128 x 128 weight blocks, activations per group of
128) against per-channel fp8 (quant/fp8.py) and bfloat16, per projection of the 8B shape, from
decode to prefill sizes; and cuBLASLt's own block-scaled kernel (torch._scaled_mm with 1x128
activation and 128x128 weight scales, CUDA 12.9+ on Hopper) where this torch has it.

    python scripts/fp8_block_bench.py [--json out.json] [--tokens 1 64 1024]

Each case times whole layer calls (activation quantization included) back to back in one CUDA
graph, each call on its own weight (a ring larger than L2): us per call, median of 5 replays.
The cuBLASLt column times the same per-group quantization plus _scaled_mm, after checking its
result against ladle's (largest relative difference printed).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from ladle.bench.gpu_timing import calls_in_graph_us
from ladle.kernels.per_token_quant import per_group_quant
from ladle.model.layers.linear import Linear
from ladle.model.layers.quant.base import install_canonical_
from ladle.model.layers.quant.fp8 import Fp8Method
from ladle.model.layers.quant.fp8_block import Fp8BlockMethod, blocks_from_group_scales

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
TOKENS = (1, 16, 64, 128, 256, 1024, 4096)
RING_BYTES = 160 << 20


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


def _cublas_block_call(layer: Linear, x: torch.Tensor):
    """A _scaled_mm call with cuBLASLt's 1x128 x 128x128 block scaling, or None where this torch
    or GPU has none. Scale layouts as torch's test_scaled_mm_block_wise_numerics passes them:
    the activations' [M, K/128] column-major, the weight's [N/128, K/128] blocks transposed."""
    weight_blocks = blocks_from_group_scales(layer.weight_scale, 128)  # [N/128, K/128]
    groups = weight_blocks.shape[1]
    padded_groups = -(-groups // 4) * 4
    scale_b = F.pad(weight_blocks, (0, padded_groups - groups)).t()  # [L4, N/128], stride [1, L4]

    def call():
        codes, scale = per_group_quant(x, torch.float8_e4m3fn, 128)
        return torch._scaled_mm(
            codes,
            layer.weight.t(),
            scale_a=scale.t().contiguous().t(),
            scale_b=scale_b,
            out_dtype=torch.bfloat16,
        )

    try:
        got = call().float()
    except (RuntimeError, ValueError) as error:
        return None, str(error).splitlines()[0][:120]
    expected = layer(x).float()
    difference = ((got - expected).norm() / expected.norm()).item()
    return call, difference


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    args = parser.parse_args()
    results = []
    for shape_name in args.shapes:
        n, k = SHAPES[shape_name]
        count = max(2, RING_BYTES // (n * k))
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
            cublas_calls, note = [], None
            for layer in layers["fp8_block"]:
                call, note = _cublas_block_call(layer, x)
                if call is None:
                    break
                cublas_calls.append(call)
            if len(cublas_calls) == len(layers["fp8_block"]):
                row["cublas_block_us"] = round(calls_in_graph_us(cublas_calls), 2)
                row["cublas_block_rel_diff"] = round(note, 5)
            else:
                row["cublas_block_error"] = note
            print(json.dumps(row), flush=True)
            results.append(row)
        del layers
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
