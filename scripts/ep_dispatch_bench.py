"""Expert parallelism's dispatch forms timed on one MoE layer of a real shape, on N GPUs (NCCL),
as start-up's `auto` times them (worker/expert_dispatch_setup.py measure_dispatch), at more step
sizes: one line per size with each form's time (slowest rank's median) and the faster form.

    python3 scripts/ep_dispatch_bench.py                       # Qwen3-30B-A3B layer, 2 GPUs
    RANKS=2 SHAPE=mixtral TUNE=1 python3 scripts/ep_dispatch_bench.py
    SHAPE=tiny python3 scripts/ep_dispatch_bench.py            # no GPU: gloo smoke run

SHAPE: qwen3-30b-a3b (hidden 2048, 128 experts, top-8, expert intermediate 768) or mixtral
(4096, 8, top-2, 14336). SIZES="1 16 256" picks the step sizes. TUNE=1 tunes the fused tiles
first (as start-up does; slower); else the default tiles. Random bf16 weights; results printed
and written to $OUT/ep_dispatch.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

SHAPES = {
    "qwen3-30b-a3b": dict(hidden=2048, experts=128, top_k=8, intermediate=768),
    "mixtral": dict(hidden=4096, experts=8, top_k=2, intermediate=14336),
    "tiny": dict(hidden=64, experts=8, top_k=2, intermediate=32),  # a CPU smoke run (gloo)
}
SIZES = [int(s) for s in os.environ.get("SIZES", "1 4 16 64 256 1024 4096 8192").split()]


def run(rank: int, ranks: int, init_file: str, shape: dict, tune: bool, out: str) -> None:
    from ladle.distributed.tensor_parallel import TensorParallel
    from ladle.model.layers.moe import SparseMoeBlock
    from ladle.worker.expert_dispatch_setup import measure_dispatch

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    options = dict(device_id=device) if on_gpu else {}
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if on_gpu else "gloo", init_method=f"file://{init_file}", rank=rank,
        world_size=ranks, **options,
    )  # fmt: skip
    tp = TensorParallel(rank, ranks, dist.group.WORLD, expert_parallel=True)
    torch.manual_seed(0)  # the same router on every rank
    with torch.device(device):
        block = SparseMoeBlock(
            shape["hidden"], shape["experts"], shape["top_k"], shape["intermediate"], True, tp
        ).to(torch.bfloat16)
    block.init_buffers()
    for param in block.parameters():
        param.data.normal_(0, 0.02)
    block.gate.weight.data.normal_(0, 1.0)
    if tune:
        from ladle.worker.fused_moe_setup import prepare_fused_moe

        setup = prepare_fused_moe(nn.ModuleList([block]), torch.bfloat16, max(SIZES))
        if rank == 0 and setup is not None:
            print(setup.describe(), flush=True)
    table = measure_dispatch(block, tp, SIZES, torch.bfloat16)
    if rank == 0:
        rows = []
        for size, form, seconds in zip(table.sizes, table.forms, table.seconds, strict=True):
            times = "  ".join(f"{name} {s * 1e3:8.3f} ms" for name, s in seconds.items())
            print(f"T={size:5d}  {times}  -> {form}", flush=True)
            rows.append(dict(tokens=size, choice=form, ms={k: v * 1e3 for k, v in seconds.items()}))
        with open(os.path.join(out, "ep_dispatch.json"), "w") as file:
            json.dump(dict(shape=shape, ranks=ranks, tuned=tune, rows=rows), file, indent=1)
    dist.destroy_process_group()


def main() -> None:
    ranks = int(os.environ.get("RANKS", "2"))
    shape = SHAPES[os.environ.get("SHAPE", "qwen3-30b-a3b")]
    tune = os.environ.get("TUNE", "0") == "1"
    out = os.environ.get("OUT", ".")
    os.makedirs(out, exist_ok=True)
    if torch.cuda.is_available():
        if torch.cuda.device_count() < ranks:
            sys.exit(f"{ranks} ranks need {ranks} GPUs; this host has {torch.cuda.device_count()}")
        print(f"{torch.cuda.get_device_name(0)} x{ranks}, shape {shape}, tuned tiles: {tune}")
    else:
        print(f"CPU (gloo) x{ranks}, shape {shape}: a smoke run, not a measurement")
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(run, args=(ranks, f"{folder}/init", shape, tune, out), nprocs=ranks)


if __name__ == "__main__":
    main()
