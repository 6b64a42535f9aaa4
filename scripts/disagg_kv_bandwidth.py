"""The KV pull of a disaggregated decode engine between two GPUs, against NCCL send/recv of
1 GiB between the same GPUs in the same run (issue 37's target: the pull >= 70% of NCCL).

Two processes, one per GPU, as `ladle serve --disaggregate 1P1D` runs them: the producer on
GPU 0 exports a stacked KV pool of the given shape (worker/kv_peers.py, CUDA IPC); the consumer
on GPU 1 maps it and pulls the blocks of one prompt of --tokens tokens through the same
PeerPools.run a decode worker calls (contiguous blocks, as a fresh prompt gets them; and the
same blocks scattered over the pool, the worst case), checks the bytes arrived, and times it.

    python3 scripts/disagg_kv_bandwidth.py --tokens 8192 --json $OUT/kv_pull.json   # 8B shape
    python3 scripts/disagg_kv_bandwidth.py --kv-dtype fp8 ...                        # fp8 KV
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from ladle.protocol.step import KV_PULL, KVOperation  # noqa: E402
from ladle.worker.kv_peers import PeerPools, export_kv_pool  # noqa: E402

NCCL_BYTES = 1 << 30


def _time(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of fn() (each run synchronized)."""
    fn()
    torch.cuda.synchronize(device)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def _worker(rank: int, args: argparse.Namespace, init_file: str, results) -> None:
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2)
    objects = dist.new_group(backend="gloo")
    dtype = torch.float8_e4m3fn if args.kv_dtype == "fp8" else torch.bfloat16
    num_blocks = -(-args.tokens // args.block_size)
    pool_blocks = 4 * num_blocks + 1
    shape = (args.layers, 2, pool_blocks, args.block_size, args.kv_heads, args.head_dim)
    if rank == 0:
        pool, descriptor = export_kv_pool(shape, dtype, device)
        pool.view(torch.uint8).random_(0, 255)
        checksum = pool.view(torch.uint8)[:, :, 1 : 1 + num_blocks].double().sum().item()
        message = [descriptor, checksum]
        dist.broadcast_object_list(message, src=0, group=objects)
    else:
        message = [None, None]
        dist.broadcast_object_list(message, src=0, group=objects)
        descriptor, checksum = message
        local = torch.zeros(shape, dtype=dtype, device=device)
        layers = list(local.unbind(0))
        peers = PeerPools(args.strategy)
        targets = list(range(1, 1 + num_blocks))
        contiguous = KVOperation(KV_PULL, list(range(1, 1 + num_blocks)), targets, -1, descriptor)
        scattered_ids = random.Random(0).sample(range(1, pool_blocks), num_blocks)
        scattered = KVOperation(KV_PULL, scattered_ids, targets, -2, descriptor)

        def pull(op):
            done, failed = peers.run([op], layers)
            assert not failed, failed

        seconds = _time(lambda: pull(contiguous), device, args.repeats)
        arrived = local.view(torch.uint8)[:, :, 1 : 1 + num_blocks].double().sum().item()
        num_bytes = local.view(torch.uint8)[:, :, 1 : 1 + num_blocks].numel()
        scattered_seconds = _time(lambda: pull(scattered), device, args.repeats)
        results["pull"] = {
            "tokens": args.tokens,
            "blocks": num_blocks,
            "bytes": num_bytes,
            "kv_dtype": args.kv_dtype,
            "strategy": args.strategy,
            "bytes_match": arrived == checksum,
            "contiguous_ms": seconds * 1000,
            "contiguous_GBps": num_bytes / seconds / 1e9,
            "scattered_ms": scattered_seconds * 1000,
            "scattered_GBps": num_bytes / scattered_seconds / 1e9,
        }
    dist.barrier(group=objects)  # the producer keeps its pool until the pulls are done
    buffer = torch.empty(NCCL_BYTES, dtype=torch.uint8, device=device)

    def send_recv():
        if rank == 0:
            dist.send(buffer, 1)
        else:
            dist.recv(buffer, 0)

    nccl_seconds = _time(send_recv, device, args.repeats)
    if rank == 1:
        results["nccl"] = {"bytes": NCCL_BYTES, "ms": nccl_seconds * 1000,
                           "GBps": NCCL_BYTES / nccl_seconds / 1e9}
    dist.barrier(group=objects)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=32)  # Llama 3.1 8B
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--kv-dtype", choices=["bf16", "fp8"], default="bf16")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--strategy", choices=["kernel", "memcpy"], default="kernel",
                        help="how a run of blocks is copied (worker/kv_peers.py)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if torch.cuda.device_count() < 2:
        print("needs 2 GPUs", file=sys.stderr)
        return 1
    init_file = f"/tmp/ladle-kvbw-{os.getpid()}"
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(args, init_file, results), nprocs=2, join=True)
        report = dict(results)
    pull, nccl = report["pull"], report["nccl"]
    report["contiguous_vs_nccl"] = pull["contiguous_GBps"] / nccl["GBps"]
    report["device"] = torch.cuda.get_device_name(0)
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
