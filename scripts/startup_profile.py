"""Where engine start-up goes: time each phase of `LLM(...)` and the Triton builds inside it.

    python scripts/startup_profile.py llama-3.1-8b --load-format dummy [--json out.json]

Phases (each wrapped from outside, so the engine code is unchanged): imports, model build and
weights (load_model; with random weights the fill inside it is timed apart), the memory probe
(size_kv_cache: the peak-forward and graph-probe steps), CUDA graph capture
(DecodeGraphs.capture), the warm-up through the real step (warm_up), and the rest. Each row
says how many Triton kernel variants were built in it and the seconds they took.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

STARTED = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default=None, help="default: ladle's default model")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from ladle.kernels.compile_log import CompileTotals, compile_totals, start_compile_log

    start_compile_log()
    import ladle.engine.engine_core as engine_core
    import ladle.model.loader as loader
    import ladle.worker.cuda_graphs as cuda_graphs
    import ladle.worker.worker as worker_module
    from ladle import LLM

    phases: list[dict] = []
    imported = time.perf_counter()
    phases.append({"phase": "python imports", "seconds": imported - STARTED, "builds": 0})

    depth = [0]

    def timed(name, function):
        def wrapper(*a, **k):
            import torch

            before, started = compile_totals() or CompileTotals(), time.perf_counter()
            depth[0] += 1
            try:
                return function(*a, **k)
            finally:
                depth[0] -= 1
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                built = (compile_totals() or CompileTotals()).since(before)
                phases.append(
                    {
                        # Nested phases (inside another timed one) are indented, not summed.
                        "phase": "  " * depth[0] + name,
                        "seconds": time.perf_counter() - started,
                        "builds": built.num_builds,
                        "build_seconds": built.seconds,
                        "disk_hits": built.num_disk_hits,
                    }
                )

        return wrapper

    loader.fill_dummy_weights = timed("random weight fill", loader.fill_dummy_weights)
    # With the build pass beside the load (worker/builds_beside_loading.py) the load's row
    # holds the builds; the engine's own "start-up phases" line (stderr) splits them.
    worker_module.load_model = timed("model build + weights", worker_module.load_model)
    worker_module.size_kv_cache = timed("memory probe (2 steps)", worker_module.size_kv_cache)
    worker_module.Worker._build_kernel_variants = timed(
        "Triton builds on a thread pool", worker_module.Worker._build_kernel_variants
    )
    cuda_graphs.DecodeGraphs.capture = timed("CUDA graph capture", cuda_graphs.DecodeGraphs.capture)
    engine_core.warm_up = timed("warm-up (real steps)", engine_core.warm_up)

    import torch

    if torch.cuda.is_available():
        timed("CUDA context", lambda: torch.empty(1, device="cuda"))()
    options = {"load_format": args.load_format}
    if args.enforce_eager:
        options["enforce_eager"] = True
    constructed = time.perf_counter()
    llm = LLM(args.model, **options)
    ready = time.perf_counter() - STARTED
    from ladle import SamplingParams

    prompt = [(7 * index) % 1000 + 10 for index in range(512)]
    timed("first request (512 in, 1 out)", llm.generate)(
        [prompt], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False
    )
    total = time.perf_counter() - STARTED
    accounted = sum(p["seconds"] for p in phases if not p["phase"].startswith("  "))
    phases.append(
        {"phase": "other (engine set-up, config, ...)", "seconds": total - accounted, "builds": 0}
    )
    totals = compile_totals()
    print(
        f"start-up of {args.model}: ready {ready:.1f} s from process start "
        f"({ready - (constructed - STARTED):.1f} s in LLM()), first token at {total:.1f} s"
    )
    for phase in phases:
        builds = phase.get("builds", 0)
        detail = (
            f"  {builds} builds, {phase.get('build_seconds', 0):.1f} s"
            f" ({phase.get('disk_hits', 0)} disk hits)"
            if builds
            else ""
        )
        print(f"  {phase['phase']:<34} {phase['seconds']:6.1f} s{detail}")
    if totals is not None:
        print(f"  total: {totals.describe()}")
    graphs = llm.engine.executor.worker.graphs
    capture_times = graphs.capture_times.describe() if graphs is not None else None
    if capture_times:
        print(f"  graph capture: {capture_times}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "model": args.model,
                    "ready_s": ready,
                    "first_token_s": total,
                    "phases": phases,
                    "capture": capture_times,
                },
                handle,
                indent=1,
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
