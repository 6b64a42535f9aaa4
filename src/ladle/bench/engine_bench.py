"""`ladle bench throughput` and `ladle bench latency`: a standard workload through the engine.

    ladle bench throughput --workload W1            # Qwen3-0.6B shape, dummy weights
    ladle bench throughput --workload W1 --peer hf --num-requests 64
    ladle bench latency --workload W3               # or W3-8b
    ladle bench throughput --model smollm2-135m --load-format dummy --num-requests 16 \\
        --input-len 32 64 --output-len 16 32        # a workload given by flags (CPU-sized)

The engine runs as LLM.generate drives it (EngineCore.step until every request finishes), with
a timestamp per emitted token: generated tok/s over the wall time of the whole run (prefill
included, after one warm-up run), TTFT and inter-token times, the peak device memory, the GPU
busy fraction (kernel time over wall time, from the torch profiler over a few steady steps of a
separate run) and the ratio of the run's time to the floor measured at start (device_floor.py).
`--peer hf` runs HF transformers' continuous batching (generate_batch, EOS off) on the same
requests in the same process. Results: a table on screen, all numbers as JSON (--json PATH).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from dataclasses import replace

from tqdm import tqdm

# torch (and device_floor, which needs it) is imported inside the functions that run a
# benchmark: `ladle` builds this module's parser for every command, `ladle serve` included,
# whose API process must not wait 1.5-3 s for torch before spawning the engine.
from ladle.bench import rank_profiles
from ladle.bench.edit_workload import edit_conversations
from ladle.bench.workloads import (
    TokenWorkload,
    WorkloadRequest,
    build_requests,
    describe_workloads,
    get_workload,
)
from ladle.cli.engine_args import add_engine_arguments, engine_options_from_args
from ladle.engine.gc_policy import collector_paused_during_run
from ladle.kernels.compile_log import compile_totals


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def run_engine(engine, requests: list[WorkloadRequest], tag: str, show_progress: bool) -> dict:
    """Every request at once through EngineCore.step; per-token timestamps on the host."""
    builds_before = compile_totals()
    meter = _expert_load_meter(engine)
    experts_before = meter.read(wait=True) if meter is not None else ()
    num_steps = 0
    started = time.perf_counter()
    arrival: dict[str, float] = {}
    last_token: dict[str, float] = {}
    ttfts: list[float] = []
    itls: list[float] = []
    num_generated = 0
    # Per request: tokens after its first and the time they took (decode ms per token).
    num_decoded = 0
    decode_seconds = 0.0
    first_token: dict[str, float] = {}
    for index, request in enumerate(requests):
        request_id = f"{tag}-{index}"
        engine.add_request(request.core_request(request_id))
        arrival[request_id] = started
    progress = tqdm(total=len(requests), desc=tag, disable=not show_progress, dynamic_ncols=True)
    # As LLM.generate runs: the collector leaves the engine's objects alone (gc_policy.py).
    with collector_paused_during_run():
        while engine.has_unfinished_requests():
            outputs = engine.step()
            num_steps += 1
            now = time.perf_counter()
            for output in outputs:
                count = len(output.new_token_ids)
                if not count:
                    continue
                num_generated += count
                previous = last_token.get(output.request_id)
                if previous is None:
                    ttfts.append(now - arrival[output.request_id])
                    first_token[output.request_id] = now
                    num_decoded += count - 1
                else:
                    itls.append(now - previous)
                    num_decoded += count
                last_token[output.request_id] = now
                if output.finish_reason is not None:
                    progress.update(1)
            progress.set_postfix_str(
                f"{num_generated / max(now - started, 1e-9):.0f} tok/s", refresh=False
            )
    progress.close()
    elapsed = time.perf_counter() - started
    decode_seconds = sum(last_token[r] - first_token[r] for r in first_token)
    engine.kv_cache_manager.reset_prefix_cache()  # the next run must not hit this one's blocks
    builds_after = compile_totals()
    experts_after = meter.read(wait=True) if meter is not None else ()
    return {
        "num_steps": num_steps,
        # Mixtures of experts: assignments per expert in this run, summed over the MoE layers.
        "expert_tokens": [a - b for a, b in zip(experts_after, experts_before, strict=True)],
        "seconds": elapsed,
        # Triton kernel variants built during the run: 0 once start-up built them all.
        "kernel_builds": (
            builds_after.since(builds_before).num_builds if builds_before and builds_after else None
        ),
        "generated_tokens": num_generated,
        "tokens_per_s": num_generated / elapsed,
        "ttft_ms": [t * 1000 for t in ttfts],
        "itl_ms": [t * 1000 for t in itls],
        # Decode time per token after each request's first (with several requests at once,
        # their decode times overlap: a latency figure at batch 1 only).
        "decode_ms_per_token": decode_seconds * 1000 / num_decoded if num_decoded else None,
    }


def _expert_load_meter(engine):
    """The in-process worker's per-expert counter (worker/expert_load.py), None for a dense
    model or workers in other processes."""
    meter = getattr(getattr(engine.executor, "worker", None), "expert_load", None)
    return meter if meter is not None and meter.num_layers else None


def expert_load_summary(expert_tokens: list[int], num_layers: int, num_steps: int) -> dict:
    """Tokens per expert per step (each layer's experts, averaged over the layers) and the
    imbalance (busiest expert over the mean): what `ladle bench` reports for MoE models."""
    if not expert_tokens or not num_steps or not num_layers:
        return {}
    per_step = [count / num_layers / num_steps for count in expert_tokens]
    mean = sum(per_step) / len(per_step)
    return {
        "expert_tokens_per_step_mean": mean,
        "expert_tokens_per_step_max": max(per_step),
        "expert_tokens_per_step_min": min(per_step),
        "expert_load_imbalance": max(per_step) / mean if mean else None,
        "expert_tokens": expert_tokens,
    }


def gpu_busy_fraction(engine, requests: list[WorkloadRequest], num_steps: int = 20) -> float | None:
    """Kernel time over wall time across num_steps steady steps (after the prompts are in)."""
    info = engine.executor.info
    if info.device_type != "cuda" or engine.config.parallel.world_size > 1:
        return None  # the profiler sees this process's kernels only
    # torch (~1 s) loads with the engine, not for `ladle serve --help` (which builds this parser).
    import torch
    from torch.profiler import ProfilerActivity, profile

    for index, request in enumerate(requests):
        engine.add_request(request.core_request(f"busy-{index}"))
    # Past every prompt: the steady decode phase.
    while engine.scheduler.waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        for _ in range(num_steps):
            if not engine.has_unfinished_requests():
                break
            engine.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    kernel_us = sum(
        event.device_time
        for event in prof.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    )
    engine.abort_requests([f"busy-{index}" for index in range(len(requests))])
    engine.kv_cache_manager.reset_prefix_cache()
    return min(1.0, kernel_us / 1e6 / wall)


def run_hf_peer(llm, requests: list[WorkloadRequest]) -> dict:
    """HF transformers' generate_batch on the same prompts; one fixed output length (the
    median of the workload's) since generate_batch takes one generation config."""
    # torch and transformers (~1.5 s together): the run needs them, `ladle serve --help` not.
    import torch
    from transformers import GenerationConfig

    from ladle.bench.offline_throughput import load_hf_peer

    info = llm.engine.executor.info
    model = load_hf_peer(info.model_path, llm.config.model.model, info.dtype, info.device_type)
    max_new = int(statistics.median(r.max_tokens for r in requests))
    config = GenerationConfig(
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    prompts = [r.prompt_token_ids for r in requests]
    model.generate_batch(inputs=prompts[:2], generation_config=config, progress_bar=False)
    started = time.perf_counter()
    results = model.generate_batch(inputs=prompts, generation_config=config, progress_bar=False)
    elapsed = time.perf_counter() - started
    generated = sum(len(r.generated_tokens) for r in results.values())
    del model
    if info.device_type == "cuda":
        torch.cuda.empty_cache()
    return {"max_new_tokens": max_new, "seconds": elapsed, "tokens_per_s": generated / elapsed}


# Tokens each warm-up request of a many-request workload generates at most.
WARMUP_TOKENS = 16


def warmup_requests(requests: list[WorkloadRequest]) -> list[WorkloadRequest]:
    """What runs before the timed runs, so first-call costs (kernel builds, graphs' first
    replays) stay out of them: a one-request workload (W3) runs as timed, the same steps; a
    many-request one runs its first 4 requests cut to WARMUP_TOKENS, not to W2's outputs of up
    to 1,024 tokens, into which --profile-ranks' step window would otherwise fall."""
    if len(requests) == 1:
        return requests
    return [replace(r, max_tokens=min(r.max_tokens, WARMUP_TOKENS)) for r in requests[:4]]
EDIT_WORKLOAD = "edit"
EDIT_NUM_REQUESTS = 12


def _edit_workload(args: argparse.Namespace) -> TokenWorkload:
    """A TokenWorkload that only names the edit class (its requests come from text)."""
    return TokenWorkload(
        EDIT_WORKLOAD, "default", args.num_requests or EDIT_NUM_REQUESTS, (0, 0), (0, 0),
        temperature=args.temperature or 0.0,
    )


def _why_no_drafts(config: dict, num_drafts: int) -> str:
    """Why a speculative run verified no draft, for the report (empty when it did)."""
    if num_drafts:
        return ""
    if config.get("adaptive", True):
        return (" (adaptive: the governor measured speculation not paying at this load, or "
                "no draft was found; '\"adaptive\": false' drafts every step)")
    return " (the proposer found nothing to draft in these prompts)"


def length_range(values: list[int], flag: str) -> tuple[int, int]:
    """--input-len / --output-len: one length (vLLM's form) or MIN MAX."""
    if len(values) > 2 or any(value < 0 for value in values) or values[0] > values[-1]:
        raise ValueError(f"{flag} takes LEN or MIN MAX (0 <= MIN <= MAX), got {values}")
    return values[0], values[-1]


def _workload_from_args(args: argparse.Namespace) -> TokenWorkload:
    workload = get_workload(args.workload)
    changes = {}
    if args.input_len:
        changes.update(input_len=length_range(args.input_len, "--input-len"),
                       fixed_input_len=None)
    if args.output_len:
        changes["output_len"] = length_range(args.output_len, "--output-len")
    if args.num_requests:
        changes["num_requests"] = args.num_requests
    if args.temperature is not None:
        changes["temperature"] = args.temperature
    if args.logprobs is not None:
        changes["logprobs"] = args.logprobs
    return replace(workload, **changes) if changes else workload


def _edit_requests(llm, args: argparse.Namespace) -> list[WorkloadRequest]:
    """The edit class (edit_workload.py) through the model's chat template, EOS on."""
    from ladle.bench.serve_workloads import edit_texts  # imports aiohttp (`bench` extra), numpy

    tokenizer = llm.tokenizer
    if tokenizer is None:
        raise ValueError("--workload edit needs a model with a tokenizer (real weights)")
    count = args.num_requests or EDIT_NUM_REQUESTS
    texts = edit_texts(tokenizer, count, seed=0)
    requests = []
    for index, edit in enumerate(edit_conversations(texts, tokenizer.encode)):
        _, token_ids, error = llm._encode_conversations([edit.messages], True, None)[0]
        if error is not None:
            raise ValueError(f"edit request {index}: {error}")
        requests.append(
            WorkloadRequest(
                prompt_token_ids=list(token_ids),
                max_tokens=edit.max_tokens,
                temperature=args.temperature or 0.0,
                seed=index,
                ignore_eos=False,
            )
        )
    return requests


def _spec_runs(engine, requests, args, show: bool) -> tuple[list[dict], dict | None]:
    """The timed runs, and with speculation on the same runs without it, interleaved (on, off,
    on, off, ...: a shared machine's load drifts) on the same engine with the proposer set
    aside (same weights, graphs and cache), plus the speculative runs' acceptance counters."""
    speculator = engine.speculator
    if speculator is None:
        return [run_engine(engine, requests, f"run{i}", show) for i in range(args.runs)], None
    scheduler = engine.scheduler
    runs, baseline = [], []
    drafted_before = copy.deepcopy(speculator.stats)
    drafted_stats = copy.deepcopy(speculator.stats)  # accumulates the speculative runs only
    for index in range(args.runs):
        speculator.forget_history()  # each run drafts only from what it saw itself
        before = copy.deepcopy(speculator.stats)
        runs.append(run_engine(engine, requests, f"run{index}", show))
        _add_stats(drafted_stats, before, speculator.stats)
        scheduler.proposer = None
        # The speculator's governor must not count the baseline's tokens as its own epochs.
        engine.speculator = None
        # A draft network in the worker (in-process) is set aside too: its pass over every
        # step's tokens is speculation's cost, not the baseline's.
        runner = getattr(getattr(engine.executor, "worker", None), "runner", None)
        drafter = getattr(runner, "drafter", None)
        if drafter is not None:
            runner.drafter = None
        # So is the device drafts' bookkeeping (worker/drafts_on_device.py): the baseline's
        # requests live in its run alone, so their device histories are not needed.
        device_drafts = getattr(runner, "device_drafts", None)
        drafts_on_device = scheduler.drafts_on_device
        if device_drafts is not None:
            runner.device_drafts = None
        scheduler.drafts_on_device = False
        try:
            baseline.append(run_engine(engine, requests, f"nospec{index}", show))
        finally:
            scheduler.proposer = speculator
            engine.speculator = speculator
            scheduler.drafts_on_device = drafts_on_device
            if drafter is not None:
                runner.drafter = drafter
            if device_drafts is not None:
                runner.device_drafts = device_drafts
    before, after = drafted_before, drafted_stats
    num_drafts = after.num_drafts - before.num_drafts
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    drafted = after.num_draft_tokens - before.num_draft_tokens
    generated = sum(r["generated_tokens"] for r in runs)
    spec_ms = _median_of(runs, "decode_ms_per_token")
    base_ms = _median_of(baseline, "decode_ms_per_token")
    speculation = {
        "config": engine.config.scheduler.speculative_config,
        "num_drafts": num_drafts,
        "num_draft_tokens": drafted,
        "num_accepted_tokens": accepted,
        # Tokens per drafted request step (1 + accepted drafts), vLLM's "mean acceptance
        # length"; steps the adaptive rule left undrafted are not in it.
        "acceptance_length": 1 + accepted / num_drafts if num_drafts else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "drafting_ms_per_token": (after.drafting_seconds - before.drafting_seconds)
        * 1000 / max(1, generated),
        "no_spec_tokens_per_s": statistics.median(r["tokens_per_s"] for r in baseline),
        "no_spec_tokens_per_s_runs": [r["tokens_per_s"] for r in baseline],
        "no_spec_decode_ms_per_token": base_ms,
        "no_spec_decode_ms_per_token_runs": [r["decode_ms_per_token"] for r in baseline],
        "speedup_tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs)
        / statistics.median(r["tokens_per_s"] for r in baseline),
        "speedup_decode_ms_per_token": base_ms / spec_ms if base_ms and spec_ms else None,
        # Each speculative run against the plain run right after it: on a loaded machine the
        # ratio of neighbours is steadier than the ratio of medians.
        "speedup_decode_ms_per_token_pairs": [
            b["decode_ms_per_token"] / r["decode_ms_per_token"]
            for r, b in zip(runs, baseline)
            if r["decode_ms_per_token"] and b["decode_ms_per_token"]
        ],
    }
    return runs, speculation


def _add_stats(total, before, after) -> None:
    """Add the counters' growth from before to after into total."""
    total.num_drafts += after.num_drafts - before.num_drafts
    total.num_draft_tokens += after.num_draft_tokens - before.num_draft_tokens
    total.num_accepted_tokens += after.num_accepted_tokens - before.num_accepted_tokens
    total.drafting_seconds += after.drafting_seconds - before.drafting_seconds


def _median_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def _apply_synthetic_acceptance(args: argparse.Namespace, options: dict) -> None:
    """--synthetic-acceptance A goes into the speculative config (which it needs)."""
    rate = getattr(args, "synthetic_acceptance", None)
    if rate is None:
        return
    if options.get("speculative_config") is None:
        raise ValueError("--synthetic-acceptance needs --speculative-config (the drafts to accept)")
    options["speculative_config"] = {**options["speculative_config"], "synthetic_acceptance": rate}


def run_bench(args: argparse.Namespace) -> int:
    # The engine and torch (~1 s) load to run, not for `ladle serve --help`.
    import torch

    from ladle import LLM
    from ladle.bench.device_floor import active_params, floor_seconds, measure_ceilings

    is_edit = args.workload == EDIT_WORKLOAD
    workload = _edit_workload(args) if is_edit else _workload_from_args(args)
    # edit needs real text: the default model (real weights) unless --model names one.
    model = args.model or (None if is_edit else workload.model_preset)
    options = engine_options_from_args(args)
    _apply_synthetic_acceptance(args, options)
    if args.model is None and not is_edit:
        options["load_format"] = "dummy"
    profiles = rank_profiles.switch_on(args.profile_ranks) if args.profile_ranks else None
    started = time.perf_counter()
    llm = LLM(model, **options)
    startup_s = time.perf_counter() - started
    # What the workers report (the model itself may live in other processes, one per rank);
    # under tensor parallelism the weights are one rank's, and so is the floor.
    engine, info = llm.engine, llm.engine.executor.info
    device = torch.device(info.device_type)
    vocab = engine.vocab_size
    if is_edit:
        requests = _edit_requests(llm, args)
    else:
        requests = build_requests(workload)
        requests = [
            replace(r, prompt_token_ids=[t % vocab for t in r.prompt_token_ids])
            for r in requests
        ]
    ceilings = measure_ceilings(device, info.dtype)
    show = not args.no_progress
    run_engine(engine, warmup_requests(requests), "warm-up", show_progress=False)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    runs, speculation = _spec_runs(engine, requests, args, show)
    best = sorted(runs, key=lambda r: r["tokens_per_s"])[len(runs) // 2]
    num_params = info.weights.num_params
    experts = info.weights.experts
    budget = info.memory_budget
    floor = floor_seconds(
        ceilings,
        num_params=num_params,
        weights_bytes=budget.weights_bytes,
        kv_bytes_per_token=budget.block_bytes // budget.block_size,
        prompt_lens=[len(r.prompt_token_ids) for r in requests],
        output_lens=[r.max_tokens for r in requests],
        max_num_seqs=llm.config.scheduler.max_num_seqs,
        experts=experts,
    )
    result = {
        "command": args.bench_command,
        "workload": workload.name,
        "model": model or "default (SmolLM2-135M-Instruct)",
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "tensor_parallel_size": llm.config.parallel.tensor_parallel_size,
        "dtype": str(info.dtype),
        "kv_cache_dtype": str(budget.kv_cache_dtype or info.dtype),
        "enforce_eager": llm.config.model.enforce_eager,
        "num_requests": len(requests),
        "startup_s": startup_s,
        "generated_tokens": best["generated_tokens"],
        "tokens_per_s_runs": [r["tokens_per_s"] for r in runs],
        "kernel_builds_runs": [r["kernel_builds"] for r in runs],
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
        "seconds": best["seconds"],
        "ttft_ms_p50": _percentile(best["ttft_ms"], 50),
        "itl_ms_p50": _percentile(best["itl_ms"], 50),
        "itl_ms_p90": _percentile(best["itl_ms"], 90),
        "itl_ms_p99": _percentile(best["itl_ms"], 99),
        "decode_ms_per_token": _median_of(runs, "decode_ms_per_token"),
        "decode_ms_per_token_runs": [r["decode_ms_per_token"] for r in runs],
        # Each rank's start-up budget: weights, activation peak, graphs, KV cache (GiB).
        "rank_memory_gib": [
            {
                "weights": rank.memory_budget.weights_bytes / 2**30,
                "activation_peak": rank.memory_budget.activation_peak_bytes / 2**30,
                "cuda_graphs": rank.memory_budget.graph_pool_bytes / 2**30,
                "kv_cache": rank.memory_budget.kv_cache_bytes / 2**30,
            }
            for rank in llm.engine.executor.rank_infos
        ],
        "peak_memory_gib": (
            torch.cuda.max_memory_allocated() / 1024**3
            if device.type == "cuda" and llm.config.parallel.world_size == 1
            else None  # in the workers' processes: their start-up budget lines give theirs
        ),
        "copy_gb_per_s": ceilings.copy_bytes_per_s / 1e9,
        "matmul_tflops": ceilings.matmul_flops_per_s / 1e12,
        "floor_seconds": floor,
        "active_params": active_params(num_params, experts),
        "floor_tokens_per_s": best["generated_tokens"] / floor,
        "ratio_to_floor": best["seconds"] / floor,
    }
    meter = _expert_load_meter(engine)
    if meter is not None:
        result.update(expert_load_summary(best["expert_tokens"], meter.num_layers,
                                          best["num_steps"]))  # fmt: skip
    fused_moe = info.fused_moe
    if fused_moe is not None:
        result["moe_tuning_s"] = fused_moe.tuning_seconds
        result["moe_tiles_from_cache"] = fused_moe.from_cache
        result["moe_plans"] = list(fused_moe.plans)
    if args.bench_command == "latency":
        result["floor_ms_per_token"] = floor * 1000 / max(1, best["generated_tokens"])
    if speculation is not None:
        result["speculation"] = speculation
    if profiles is not None:
        result["rank_profiles"] = rank_profiles.read(profiles, llm.config.parallel.world_size)
    if not args.no_busy:
        result["gpu_busy_fraction"] = gpu_busy_fraction(engine, requests)
    _report(result, args.json)  # ladle's numbers stand even if the peer fails or runs long
    if args.peer == "hf":
        peer_requests = requests[: args.peer_requests] if args.peer_requests else requests
        result["hf_peer"] = run_hf_peer(llm, peer_requests)
        result["hf_peer"]["num_requests"] = len(peer_requests)
        _report(result, args.json)
    return 0


def _report(result: dict, json_path: str | None) -> None:
    _print_table(result)
    if json_path:
        with open(json_path, "w") as handle:
            json.dump(result, handle, indent=1)


def _print_table(result: dict) -> None:
    rows = [
        ("workload", f"{result['workload']} ({result['model']}, {result['num_requests']} req)"),
        ("device", f"{result['device']} {result['dtype']}, eager={result['enforce_eager']}"),
        ("generated tok/s (median)", f"{result['tokens_per_s']:,.0f}"),
        ("generated tokens", f"{result['generated_tokens']:,}"),
        ("TTFT p50 (ms)", _fmt(result["ttft_ms_p50"])),
        ("ITL p50/p90/p99 (ms)", "/".join(_fmt(result[f"itl_ms_p{q}"]) for q in (50, 90, 99))),
        ("peak memory incl. KV pool (GiB)", _fmt(result["peak_memory_gib"])),
        ("GPU busy fraction", _fmt(result.get("gpu_busy_fraction"))),
        ("floor tok/s", f"{result['floor_tokens_per_s']:,.0f}"),
        ("time / floor", f"{result['ratio_to_floor']:.2f}x"),
        ("start-up (s)", f"{result['startup_s']:.1f}"),
    ]
    if "floor_ms_per_token" in result:
        rows.append(("floor ms/token", _fmt(result["floor_ms_per_token"])))
    if "expert_load_imbalance" in result:
        rows.append((
            "MoE tokens/expert/step mean/max/min",
            "/".join(_fmt(result[f"expert_tokens_per_step_{k}"]) for k in ("mean", "max", "min")),
        ))  # fmt: skip
        rows.append(("MoE load imbalance (max/mean)", _fmt(result["expert_load_imbalance"])))
    if "moe_tuning_s" in result:
        source = "cache" if result["moe_tiles_from_cache"] else "tuned"
        rows.append(("MoE tile tuning (s)", f"{result['moe_tuning_s']:.1f} ({source})"))
    rows.append(("decode ms/token (median)", _fmt(result.get("decode_ms_per_token"))))
    if "rank_profiles" in result:
        rows += rank_profiles.table_rows(result["rank_profiles"])
    speculation = result.get("speculation")
    if speculation is not None:
        rows += [
            ("speculation", json.dumps(speculation["config"])),
            ("acceptance length / rate", f"{_fmt(speculation['acceptance_length'])} / "
             f"{_fmt(speculation['acceptance_rate'])}"),
            ("drafted steps / draft tokens",
             f"{speculation['num_drafts']} / {speculation['num_draft_tokens']}"
             + _why_no_drafts(speculation["config"], speculation["num_drafts"])),
            ("without speculation: tok/s", f"{speculation['no_spec_tokens_per_s']:,.1f}"),
            ("without speculation: decode ms/token",
             _fmt(speculation["no_spec_decode_ms_per_token"])),
            ("speed-up (tok/s; decode ms/token)",
             f"{speculation['speedup_tokens_per_s']:.2f}x; "
             f"{_fmt(speculation['speedup_decode_ms_per_token'])}x"),
            ("speed-up per pair of runs (decode)",
             ", ".join(f"{ratio:.2f}x" for ratio in speculation[
                 "speedup_decode_ms_per_token_pairs"])),
            ("drafting (host ms per token)", _fmt(speculation["drafting_ms_per_token"])),
        ]
    if "hf_peer" in result:
        peer = result["hf_peer"]
        rows.append(
            (
                "HF generate_batch tok/s",
                f"{peer['tokens_per_s']:,.0f} ({peer['num_requests']} req, "
                f"{peer['max_new_tokens']} new each)",
            )
        )
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    sys.stdout.flush()


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def add_bench_parsers(commands) -> None:
    """Register `ladle bench throughput|latency` under the `ladle bench` subcommands."""
    for name, default, help_text in (
        ("throughput", "W1", "offline generated tok/s of W1, W2 or a workload given by flags"),
        ("latency", "W3", "one request: TTFT and inter-token times (W3, W3-8b)"),
    ):
        sub = commands.add_parser(
            name, help=help_text, description=help_text, epilog=describe_workloads(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.add_argument(
            "--workload", default=default,
            help=f"a standard workload, described below (default {default})",
        )
        sub.add_argument("--model", default=None, help="default: the workload's preset (dummy)")
        # vLLM's spellings too: bench throughput's --num-prompts, bench latency's --batch-size
        # (all its requests run as one batch, as here) and --num-iters.
        sub.add_argument("--num-requests", "--num-prompts", "--batch-size", type=int,
                         default=None)
        sub.add_argument("--input-len", type=int, nargs="+", default=None, metavar="LEN",
                         help="LEN (every prompt, as vLLM's flag) or MIN MAX")
        sub.add_argument("--output-len", type=int, nargs="+", default=None, metavar="LEN",
                         help="LEN (every output, as vLLM's flag) or MIN MAX")
        sub.add_argument("--temperature", type=float, default=None)
        sub.add_argument(
            "--logprobs", type=int, default=None, metavar="K",
            help="each request asks for K top logprobs (0: the sampled token's alone, as "
            "`ladle bench serve --token-ids` asks)",
        )
        sub.add_argument("--runs", "--num-iters", type=int, default=3,
                         help="timed runs; the median is reported")
        sub.add_argument("--peer", choices=["none", "hf"], default="none")
        sub.add_argument("--peer-requests", type=int, default=None, help="HF on the first N only")
        sub.add_argument("--no-busy", action="store_true", help="skip the profiled busy fraction")
        sub.add_argument("--no-progress", action="store_true")
        sub.add_argument(
            "--profile-ranks", nargs="?", const=rank_profiles.DEFAULT_WINDOW, default=None,
            metavar="SKIP:COUNT",
            help="each rank profiles steps SKIP..SKIP+COUNT of its own (default "
            f"{rank_profiles.DEFAULT_WINDOW}); reports per rank the step's wall, kernel-busy "
            "and collective time",
        )
        sub.add_argument("--json", "--output-json", default=None,
                         help="also write the results here")
        sub.add_argument(
            "--synthetic-acceptance", type=float, default=None, metavar="A",
            help="with --speculative-config: accept each draft with probability A instead of "
            "verifying it (speed on random weights; the outputs are then NOT the model's)",
        )
        add_engine_arguments(sub)
        sub.set_defaults(handler=run_bench)
