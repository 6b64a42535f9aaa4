"""The KV host tier's host cost per step when nothing hits (issue 36), measured on the CPU.

    python scripts/kv_tier_host_cost.py [--requests 256] [--max-num-seqs 128]
        [--kv-offloading-size 0.008] [--json PATH] [--cprofile N]

S1's shape (distinct prompts of 100-1024 tokens, 100-512 output tokens, 128 in flight, prefix
caching on, every block distinct so nothing ever hits) through LLM's loop on the CPU, over the
0.6B shape shrunk to one small layer (tests/helpers/host_ops.py TINY_LAYER), the decode graph
path emulated, overlapped scheduling on, as on CUDA. Two engines in one process, the tier off
and the tier on; for each, per step:

- the host's thread CPU time, with the GPU's work (the model forward, the logits, and the KV
  copies themselves, which are DMAs and kernels on CUDA) timed apart and left out;
- the tier's own phases: ordering stores (scheduler side), taking them into the plan, issuing
  them in the worker (everything in KVCopier.run but the copies), settling them from the result;
- how many blocks were stored per step, and their bytes at the 0.6B's 1.75 MiB a block.

The default tier of 0.008 GiB holds ~2,000 one-layer blocks: like the H200 run's 4 GiB of
1.75 MiB blocks (2,340), it fills within the run and every later store evicts.
CPU numbers: compare them with each other (off/on, before/after), not with an H200's.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import sys
import time
from pathlib import Path

import torch

from ladle import LLM, SamplingParams
from ladle.core.kv_cache_manager import KVCacheManager
from ladle.core.kv_transfers import KVTransfers
from ladle.worker.kv_copier import KVCopier

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.emulated_graphs import EmulatedGraph, install_emulated_graphs  # noqa: E402
from helpers.host_ops import TINY_LAYER, PhaseTimer  # noqa: E402

GPU_PHASES = ("model forward (GPU work)", "logits (GPU work)", "KV copies (GPU work)")
BLOCK_BYTES_0_6B = 28 * 2 * 16 * 8 * 128 * 2  # layers x (K, V) x block x heads x dim x bf16


def _build_llm(args, size: float) -> LLM:
    options = dict(
        load_format="dummy",
        device="cpu",
        max_num_seqs=args.max_num_seqs,
        async_scheduling=True,
        enable_prefix_caching=True,
        hf_overrides=TINY_LAYER,
        cpu_kv_cache_gib=args.cpu_kv_cache_gib,
    )
    if size:
        options["kv_offloading_size"] = size
    llm = LLM("qwen3-0.6b", **options)
    install_emulated_graphs(llm.engine.executor.worker)
    return llm


def _wrap(timer: PhaseTimer, owner: object, attribute: str, phase: str) -> None:
    """Time the phase, if this tree has it (the script also measures older trees)."""
    if hasattr(owner, attribute):
        timer.wrap(owner, attribute, phase)


def _wrap_phases(llm: LLM, timer: PhaseTimer) -> None:
    engine = llm.engine
    runner = engine.executor.worker.runner
    timer.wrap(runner.model, "forward", GPU_PHASES[0])
    timer.wrap(EmulatedGraph, "replay", GPU_PHASES[0])
    timer.wrap(runner.model, "compute_logits", GPU_PHASES[1])
    _wrap(timer, KVCopier, "_store", GPU_PHASES[2])
    _wrap(timer, KVCopier, "_load", GPU_PHASES[2])
    _wrap(timer, KVCopier, "run", "tier: issue copies (worker)")
    _wrap(timer, KVCopier, "take_stats", "tier: copy stats (worker)")
    _wrap(timer, KVCopier, "wait_for_earlier_copies", "tier: wait for earlier copies (worker)")
    _wrap(timer, KVTransfers, "_store", "tier: order stores (scheduler)")
    _wrap(timer, KVTransfers, "store", "tier: order stores (scheduler)")
    _wrap(timer, KVTransfers, "write_back_ahead", "tier: look ahead in the free queue (scheduler)")
    _wrap(timer, KVTransfers, "take_operations", "tier: take operations (scheduler)")
    _wrap(timer, KVCacheManager, "finish_transfers", "tier: settle copies (scheduler)")
    timer.wrap(engine, "step", "engine step (everything else)")
    timer.wrap(llm.output_processor, "process_outputs", "output processing")


def _run(llm: LLM, args, profile: cProfile.Profile | None) -> dict:
    rng = random.Random(args.seed)
    vocab = llm.engine.vocab_size
    for index in range(args.requests):
        prompt_len = rng.randint(100, 1024)
        prompt = [rng.randrange(5, vocab - 5) for _ in range(prompt_len)]
        params = SamplingParams(
            temperature=0.6, max_tokens=rng.randint(100, 512), ignore_eos=True, seed=index
        )
        llm._submit(f"s1-{index}", None, prompt, params, time.monotonic(), 0)
    timer = PhaseTimer()
    _wrap_phases(llm, timer)
    engine = llm.engine
    steps = 0
    host_seconds = 0.0
    wall_started = time.perf_counter()
    timer.recording = True
    if profile is not None:
        profile.enable()
    while engine.has_unfinished_requests():
        started = time.thread_time()
        llm.output_processor.process_outputs(engine.step())
        host_seconds += time.thread_time() - started
        steps += 1
    if profile is not None:
        profile.disable()
    timer.recording = False
    wall = time.perf_counter() - wall_started
    phases = {name: seconds / steps * 1e6 for name, seconds in timer.seconds.items()}
    gpu_us = sum(phases.get(name, 0.0) for name in GPU_PHASES)
    manager = engine.scheduler.kv_cache_manager
    counts = manager.transfers.counts if manager.transfers is not None else None
    stored = counts.num_blocks_stored if counts is not None else 0
    return {
        "steps": steps,
        "wall_s": wall,
        "host_us_per_step": host_seconds / steps * 1e6 - gpu_us,
        "tier_us_per_step": sum(us for name, us in phases.items() if name.startswith("tier:")),
        "blocks_stored_per_step": stored / steps,
        "stores_dropped": counts.num_stores_dropped if counts is not None else 0,
        "blocks_stored_at_eviction": getattr(counts, "num_blocks_stored_at_eviction", 0),
        "mib_stored_per_step_at_0.6b": stored / steps * BLOCK_BYTES_0_6B / 2**20,
        "phase_us_per_step": dict(sorted(phases.items(), key=lambda item: -item[1])),
    }


def _own_seconds(profile: cProfile.Profile) -> dict[str, float]:
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return {
        f"{Path(file).name}:{line}({function})": entry[2]
        for (file, line, function), entry in stats.items()
    }


def _print_profile_difference(profiles: dict, result: dict, top: int) -> None:
    """The functions whose own time per step grew most from the first run to the second."""
    (off_name, off), (on_name, on) = list(profiles.items())[:2]
    off_seconds, on_seconds = _own_seconds(off), _own_seconds(on)
    off_steps, on_steps = result[off_name]["steps"], result[on_name]["steps"]
    growth = {
        name: on_seconds.get(name, 0.0) / on_steps - off_seconds.get(name, 0.0) / off_steps
        for name in {*off_seconds, *on_seconds}
    }
    print(f"== own time per step, {on_name} minus {off_name} (cProfile, us)")
    for name, seconds in sorted(growth.items(), key=lambda item: -abs(item[1]))[:top]:
        print(f"  {seconds * 1e6:+9.1f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--kv-offloading-size", type=float, default=0.008)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cpu-kv-cache-gib", type=float, default=0.5,
        help="the device pool (0.5: ~131k one-layer blocks, never full, as S1 on an H200; "
        "0.12: ~31k, full and evicting within the run, as a long-running server)",
    )
    parser.add_argument("--pairs", type=int, default=1, help="off/on pairs, alternating")
    parser.add_argument(
        "--cprofile", type=int, default=0,
        help="print the N functions whose own time grew most from off to on",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {}
    profiles: dict[str, cProfile.Profile] = {}
    runs = [("tier_off", 0.0), ("tier_on", args.kv_offloading_size)]
    if args.pairs > 1:
        runs = [(f"{name}_{pair}", size) for pair in range(args.pairs) for name, size in runs]
    for name, size in runs:
        llm = _build_llm(args, size)
        profile = cProfile.Profile() if args.cprofile else None
        result[name] = _run(llm, args, profile)
        if profile is not None:
            profiles[name] = profile
        del llm
    for name, figures in result.items():
        print(f"== {name}: {figures['steps']} steps, host {figures['host_us_per_step']:.0f} us"
              f"/step (GPU work left out), tier {figures['tier_us_per_step']:.1f} us/step, "
              f"{figures['blocks_stored_per_step']:.1f} blocks stored/step "
              f"({figures['mib_stored_per_step_at_0.6b']:.1f} MiB at the 0.6B), "
              f"{figures['stores_dropped']} dropped, "
              f"{figures['blocks_stored_at_eviction']} stored at eviction, "
              f"wall {figures['wall_s']:.1f} s")
        for phase, us in figures["phase_us_per_step"].items():
            print(f"  {us:9.1f} us  {phase}")
    if len(profiles) >= 2:
        _print_profile_difference(profiles, result, args.cprofile)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
