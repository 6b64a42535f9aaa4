"""Where a decode step's GPU time goes, kernel by kernel (issue 8, W3 on the 8B shape).

    python scripts/decode_kernel_profile.py --model llama-3.1-8b --batch 1 --steps 40

Runs --batch requests of a 512-token prompt into steady decode, then profiles --steps engine
steps with the torch profiler (kernels inside CUDA graph replays included). Prints one JSON
line: wall and kernel-busy ms per step, the number of kernels and of gaps between them per
step, the summed gap time, and the kernels grouped by name (us per step, launches per step),
largest first.
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ladle import LLM
from ladle.bench.gpu_timing import busy_and_gaps
from ladle.protocol.messages import EngineCoreRequest
from ladle.sampling.params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--kv-cache-dtype", default="auto")
    args = parser.parse_args()
    options = {"kv_cache_dtype": args.kv_cache_dtype}
    if args.quantization:
        options["quantization"] = args.quantization
    llm = LLM(args.model, load_format="dummy", **options)
    engine = llm.engine
    for index in range(args.batch):
        prompt = [(index * 7919 + position * 31) % 10000 + 1 for position in range(args.prompt_len)]
        engine.add_request(
            EngineCoreRequest(
                request_id=f"profile-{index}",
                prompt_token_ids=prompt,
                sampling_params=SamplingParams(max_tokens=10_000, ignore_eos=True, temperature=0),
                eos_token_ids=(0,),
            )
        )
    # Every prompt in (chunked prefill), then a few decode steps.
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running) or len(
        engine.scheduler.waiting
    ):
        engine.step()
    for _ in range(5):
        engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    kernels = sorted(
        (event.time_range.start, event.time_range.end, event.name)
        for event in prof.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    )
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for start, end, name in kernels:
        by_name[name].append(end - start)
    busy_us, gaps = busy_and_gaps((start, end) for start, end, _ in kernels)
    steps = args.steps
    table = sorted(
        (
            {
                "kernel": name[:110],
                "us_per_step": round(sum(times) / steps, 1),
                "per_step": round(len(times) / steps, 2),
                "us_median": round(sorted(times)[len(times) // 2], 2),
            }
            for name, times in by_name.items()
        ),
        key=lambda row: -row["us_per_step"],
    )
    print(
        json.dumps(
            {
                "model": args.model,
                "batch": args.batch,
                "quantization": args.quantization,
                "kv_cache_dtype": args.kv_cache_dtype,
                "steps": steps,
                "wall_ms_per_step": round(wall * 1000 / steps, 3),
                "kernel_busy_ms_per_step": round(busy_us / 1000 / steps, 3),
                "kernels_per_step": round(len(kernels) / steps, 1),
                "gaps_per_step": round(len(gaps) / steps, 1),
                "gap_ms_per_step": round(sum(gaps) / 1000 / steps, 3),
                "kernel_sum_ms_per_step": round(
                    sum(end - start for start, end, _ in kernels) / 1000 / steps, 3
                ),
                "kernels": table[: args.top],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
