"""What an act-order int4 checkpoint's input gather costs (quant/act_order.py): int4 layers of
the 8B shape with and without an input_permutation, whole layer calls back to back in one CUDA
graph, each on its own weight (a ring larger than L2); us per call, median of 5 replays.

    python scripts/act_order_cost.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn

from ladle.bench.gpu_timing import PROJECTIONS_8B, WEIGHT_RING_BYTES, calls_in_graph_us
from ladle.model.layers.linear import Linear
from ladle.model.layers.quant.base import install_canonical_
from ladle.model.layers.quant.int4 import Int4Method


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    method = Int4Method()
    rows = []
    for name, (n, k) in PROJECTIONS_8B.items():
        layers = []
        for _ in range(max(2, 2 * WEIGHT_RING_BYTES // (n * k))):
            layer = Linear(k, n).cuda()
            install_canonical_(layer, method, method.quantize(torch.randn(n, k, device="cuda")))
            method.finalize(layer)
            layers.append(layer)
        permutation = nn.Parameter(torch.randperm(k, device="cuda"), requires_grad=False)
        for tokens in (1, 16, 64, 256):
            x = torch.randn(tokens, k, device="cuda").bfloat16()
            row = {"shape": name, "tokens": tokens}
            for label, gather in (("in_order_us", None), ("act_order_us", permutation)):
                for layer in layers:
                    layer.input_permutation = gather
                calls = [lambda layer=layer, x=x: layer(x) for layer in layers]
                row[label] = round(calls_in_graph_us(calls), 2)
            print(json.dumps(row), flush=True)
            rows.append(row)
        del layers
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
