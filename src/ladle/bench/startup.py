"""`ladle bench startup`: start-up as users meet it, from process start to the first token.

    ladle bench startup                                   # the default model, offline
    ladle bench startup llama-3.1-8b                      # random weights of a preset's shape
    ladle bench startup llama-3.1-8b --write-checkpoint /tmp/ckpt   # a safetensors folder on disk
    ladle bench startup qwen3-0.6b --serve --triton-cache cold --runs 3 --json out.json

Each run is a fresh Python process (startup_runs.py); the clock starts before its spawn and stops
at the first generated token. Offline runs build LLM(...) and generate one token; --serve runs
`ladle serve` and stream one completion. --triton-cache cold gives every run an empty Triton
cache and an empty ladle cache (LADLE_CACHE_DIR: converted tokenizers, the CPU's C kernels, the
default model's copy); warm shares one of each between the runs, filled by a first run that is
not reported; asis leaves the environment's caches as they are. The figure is the median of
--runs; each run's engine phases (the start-up phases line the engine prints) come with it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ladle.bench.startup_runs import (
    StartupRun,
    StartupRunError,
    run_offline_once,
    run_serve_once,
)
from ladle.model.default_model import default_model_if_cached

# Short, and every id below every vocabulary ladle runs (tiny presets have 512).
PROMPT_TOKEN_IDS = [1, 17, 42, 99, 123, 7, 300]
CACHE_MODES = ("cold", "warm", "asis")


def add_bench_startup_parser(commands) -> None:
    sub = commands.add_parser(
        "startup",
        help="start-up from process start to the first token (offline or --serve)",
        description=(__doc__ or "").split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.add_argument(
        "model", nargs="?", default=None, help="preset, HF folder or .gguf; default: SmolLM2-135M"
    )
    sub.add_argument(
        "--load-format",
        choices=("dummy", "auto", "safetensors", "gguf"),
        default=None,
        help="default: dummy for a preset name, else auto",
    )
    sub.add_argument(
        "--write-checkpoint",
        metavar="DIR",
        default=None,
        help="write random weights of the preset's shape to DIR as a safetensors folder (kept "
        "if already complete) and load that, as users load a downloaded model",
    )
    sub.add_argument("--triton-cache", choices=CACHE_MODES, default="warm")
    sub.add_argument("--runs", type=int, default=1, help="reported runs; the median is the figure")
    sub.add_argument("--serve", action="store_true", help="time `ladle serve` and one stream")
    sub.add_argument(
        "--evict-page-cache",
        action="store_true",
        help="drop the model files from the OS page cache before each run (read from disk)",
    )
    sub.add_argument(
        "--engine-args",
        default="",
        help="more engine flags, one quoted string in shell syntax (a single flag: "
        "--engine-args=--enforce-eager)",
    )
    sub.add_argument(
        "--child-pythonpath",
        default=None,
        help="PYTHONPATH of the measured processes: another tree's src to time it instead "
        "(a before/after comparison; that tree needs ladle/bench/startup_child.py)",
    )
    sub.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    sub.add_argument("--json", default=None, help="write every number here")
    sub.set_defaults(handler=run_bench_startup)


def run_bench_startup(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise ValueError("--runs must be at least 1")
    model, engine_flags = _model_and_flags(args)
    try:
        runs, unreported = measure_startup(
            model,
            engine_flags,
            runs=args.runs,
            triton_cache=args.triton_cache,
            serve=args.serve,
            timeout_s=args.timeout,
            evict=_model_files(model) if args.evict_page_cache else [],
            child_pythonpath=args.child_pythonpath,
        )
    except StartupRunError as error:
        print(f"ladle bench startup: {error}", file=sys.stderr)
        return 1
    result = summarize(runs, unreported)
    result.update(
        model=model,
        engine_flags=engine_flags,
        child_pythonpath=args.child_pythonpath,
        serve=args.serve,
        triton_cache=args.triton_cache,
        evict_page_cache=args.evict_page_cache,
    )
    print(format_report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


def _model_and_flags(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    model = args.model
    load_format = args.load_format
    if args.write_checkpoint:
        if model is None:
            raise ValueError("--write-checkpoint needs a preset name (or a config.json folder)")
        model = str(_write_checkpoint(model, args.write_checkpoint))
        load_format = load_format if load_format not in (None, "dummy") else "auto"
    elif load_format is None:
        load_format = "dummy" if model is not None and _is_preset(model) else "auto"
    return model, ["--load-format", load_format, *shlex.split(args.engine_args)]


def _is_preset(name: str) -> bool:
    # The loader imports torch (~1 s): `ladle serve --help` builds this subcommand's parser.
    from ladle.model.loader.presets import get_preset

    return not Path(name).expanduser().exists() and get_preset(name) is not None


def _write_checkpoint(model: str, out_dir: str) -> Path:
    # torch (~1 s) loads to write the checkpoint, not for `ladle serve --help`.
    import torch

    from ladle.model.loader.random_checkpoint import write_random_checkpoint

    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    path = write_random_checkpoint(model, out_dir, torch.bfloat16, device)
    print(f"[bench] checkpoint {path} ready in {time.perf_counter() - started:.1f} s (not timed)")
    return path


def _model_files(model: str | None) -> list[Path]:
    if model is None:
        cached = default_model_if_cached()
        return [cached] if cached is not None else []
    path = Path(model).expanduser()
    if path.is_file():
        return [path]
    return sorted(path.glob("*.safetensors")) if path.is_dir() else []


def evict_from_page_cache(files: list[Path]) -> None:
    """Ask the kernel to drop the files' clean pages (no root needed), so the next read comes
    from disk as after a reboot or a fresh download pushed out of memory."""
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)  # pages still waiting to be written back cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def measure_startup(
    model: str | None,
    engine_flags: list[str],
    runs: int = 1,
    triton_cache: str = "warm",
    serve: bool = False,
    timeout_s: float = 900.0,
    evict: list[Path] | None = None,
    child_pythonpath: str | None = None,
) -> tuple[list[StartupRun], list[StartupRun]]:
    """(reported runs, unreported cache-filling runs): each a fresh process, spawn to first
    token, with the Triton and ladle caches triton_cache asks for."""
    if triton_cache not in CACHE_MODES:
        raise ValueError(f"triton_cache must be one of {CACHE_MODES}, not {triton_cache!r}")
    run_once = run_serve_once if serve else run_offline_once
    reported: list[StartupRun] = []
    unreported: list[StartupRun] = []
    with tempfile.TemporaryDirectory(prefix="ladle-startup-caches-") as root:
        for index in range(runs + (triton_cache == "warm")):
            env = dict(os.environ)
            if child_pythonpath:
                # First on the path (its ladle shadows this one); what was there stays after
                # it (packages installed to a folder, as on the device machines).
                inherited = env.get("PYTHONPATH")
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [child_pythonpath, inherited]))
            if triton_cache != "asis":
                # cold: a fresh pair per run; warm: one pair for every run.
                caches = Path(root) / (f"run{index}" if triton_cache == "cold" else "shared")
                env["TRITON_CACHE_DIR"] = str(caches / "triton")
                env["LADLE_CACHE_DIR"] = str(caches / "ladle")
            if evict:
                evict_from_page_cache(evict)
            run = run_once(model, engine_flags, PROMPT_TOKEN_IDS, env, timeout_s)
            filling = triton_cache == "warm" and index == 0
            (unreported if filling else reported).append(run)
    return reported, unreported


def summarize(runs: list[StartupRun], unreported: list[StartupRun]) -> dict:
    """The median run's figures, and every run's."""
    totals = [run.total_s for run in runs]
    median_run = sorted(runs, key=lambda run: run.total_s)[(len(runs) - 1) // 2]
    return {
        "first_token_s_median": statistics.median(totals),
        "first_token_s_min": min(totals),
        "first_token_s_max": max(totals),
        "median_run": median_run.as_dict(),
        "runs": [run.as_dict() for run in runs],
        "cache_filling_runs": [run.as_dict() for run in unreported],
    }


def format_report(result: dict) -> str:
    mode = "ladle serve + one streamed token" if result["serve"] else "LLM(...) + generate"
    lines = [
        f"start-up of {result['model'] or 'the default model'} ({mode}; "
        f"{' '.join(result['engine_flags'])}; caches {result['triton_cache']}"
        f"{', page cache evicted' if result['evict_page_cache'] else ''})",
        f"  process start to first token: median {result['first_token_s_median']:.2f} s "
        f"(min {result['first_token_s_min']:.2f}, max {result['first_token_s_max']:.2f}, "
        f"{len(result['runs'])} runs)",
    ]
    median = result["median_run"]
    child = median["child"]
    if child:
        lines.append(
            f"  in the child: imports {child['imports_s']:.2f} s, LLM() {child['llm_init_s']:.2f} "
            f"s, generate {child['generate_s']:.2f} s (the rest is the interpreter's start "
            "and the result's trip back)"
        )
    if median["ready_s"] is not None:
        lines.append(f"  /health answered after {median['ready_s']:.2f} s")
    if median["phases"]:
        phases = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in median["phases"].items())
        lines.append(f"  engine phases: {phases}")
    if median["warmup_report"]:
        lines.append(f"  engine: {median['warmup_report']}")
    return "\n".join(lines)
