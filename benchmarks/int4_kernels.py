"""The int4 decode kernels against bf16 cuBLAS at the Llama-3.1-8B shapes, per batch size.

    python benchmarks/int4_kernels.py [--json out.json]

For each projection (qkv, o, gate_up, down) a random N(0, 0.02) weight is quantized to int4
(group 128) and every candidate of the load-time plan (model/layers/quant/int4_plan.py) is timed
at every batch bucket, beside F.linear on the bf16 weight (cuBLAS) in the same process: GPU
microseconds per call from CUDA-graph replays (medians). Also reported: the kernel the plan picks
per bucket and the bandwidth it reaches over the packed weight, scales and zeros.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

LAYERS_8B = {
    "qkv": (4096, 6144),
    "o": (4096, 4096),
    "gate_up": (4096, 28672),
    "down": (14336, 4096),
}


@torch.no_grad()
def bench_layer(name: str, inputs: int, outputs: int) -> list[dict]:
    from ladle.model.layers.quant.int4 import GROUP_SIZE, Int4Method, num_groups
    from ladle.model.layers.quant.int4_plan import BUCKETS, measure_plan, time_in_graph_us

    generator = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(outputs, inputs, device="cuda", generator=generator) * 0.02
    weight = weight.to(torch.bfloat16)
    tensors = Int4Method().quantize(weight)
    packed_t = tensors["weight_packed"].t().contiguous()
    scale_t = tensors["weight_scale"].t().contiguous()
    zero_t = tensors["weight_zero"].t().to(torch.float16).contiguous()
    plan = measure_plan(packed_t, scale_t, zero_t, GROUP_SIZE, inputs, torch.bfloat16)
    weight_bytes = packed_t.numel() * 4 + 2 * 2 * num_groups(inputs) * outputs
    rows = []
    for bucket in BUCKETS:
        x = torch.randn(bucket, inputs, device="cuda", generator=generator).to(torch.bfloat16)
        bf16_us = time_in_graph_us(lambda x=x: F.linear(x, weight))
        timings = plan.timings_us[bucket]
        chosen = min(timings, key=timings.get)
        row = {
            "layer": name,
            "shape": [inputs, outputs],
            "tokens": bucket,
            "bf16_cublas_us": bf16_us,
            "int4_us": timings[chosen],
            "chosen": chosen,
            "speedup_vs_bf16": bf16_us / timings[chosen],
            "int4_weight_GBps": weight_bytes / timings[chosen] / 1e3,
            "bf16_weight_GBps": weight.numel() * 2 / bf16_us / 1e3,
            "candidates_us": timings,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if plan.rejected:
        print(json.dumps({"layer": name, "rejected": plan.rejected}), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = {"device": torch.cuda.get_device_name(), "layers": []}
    for name, (inputs, outputs) in LAYERS_8B.items():
        result["layers"].extend(bench_layer(name, inputs, outputs))
    print(f"{'layer':<8} {'M':>4} {'bf16 us':>8} {'int4 us':>8} {'x':>5}  chosen")
    for row in result["layers"]:
        print(
            f"{row['layer']:<8} {row['tokens']:>4} {row['bf16_cublas_us']:>8.1f} "
            f"{row['int4_us']:>8.1f} {row['speedup_vs_bf16']:>5.2f}  {row['chosen']}"
        )
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=1)


if __name__ == "__main__":
    main()
