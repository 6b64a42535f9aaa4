"""`ladle serve` with a paced stand-in engine: the real API process, an engine of known speed.

    python -m ladle.bench.paced_serve --step-ms 7 [--paced-tokenizer none|PATH] -- \
        qwen3-0.6b --load-format dummy --port 8123

Everything after `--` goes to `ladle serve` unchanged (the same HTTP stack, request logging,
detokenizer, stop checks, SSE and metrics), but the engine-core process it spawns is
`ladle.bench.paced_engine`'s: one token per running request every --step-ms, no GPU. So the
inter-token times a client sees, against the known step, show what the API process (and the
client) add; its CPU time per output token says how close it runs to a full core.
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import gc
import os
import sys
import time

import ladle.frontend.client as client_module
from ladle.bench.paced_engine import STEP_MS_ENV, TOKENIZER_ENV, paced_engine_core
from ladle.cli.main import main as ladle_main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    own, serve_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv \
        else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-ms", type=float, default=7.0)
    parser.add_argument(
        "--paced-tokenizer",
        default=None,
        help="the tokenizer whose ids the engine emits and the API decodes: a path, or 'none' "
        "(no detokenization, as random weights without a tokenizer serve); default: the "
        "default model's",
    )
    parser.add_argument("--profile", default=None, help="cProfile the API process into this file")
    parser.add_argument(
        "--gc-probe", action="store_true",
        help="time the API process's garbage collections; a summary line on stderr at exit",
    )
    args = parser.parse_args(own)
    if args.gc_probe:
        _install_gc_probe()
    os.environ[STEP_MS_ENV] = str(args.step_ms)
    if args.paced_tokenizer is not None:
        os.environ[TOKENIZER_ENV] = args.paced_tokenizer
    client_module.run_engine_core = paced_engine_core  # what AsyncEngineClient spawns
    if args.profile is None:
        return ladle_main(["serve", *serve_args])
    profiler = cProfile.Profile()
    try:
        return profiler.runcall(ladle_main, ["serve", *serve_args])
    finally:
        profiler.dump_stats(args.profile)


def _install_gc_probe() -> None:
    """Collections per generation and the time spent in them (gc.callbacks), printed at exit."""
    seconds = [0.0, 0.0, 0.0]
    counts = [0, 0, 0]
    longest = [0.0]
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        elapsed = time.perf_counter() - started[0]
        seconds[info["generation"]] += elapsed
        counts[info["generation"]] += 1
        longest[0] = max(longest[0], elapsed)

    def report() -> None:
        rounded = [round(s, 3) for s in seconds]
        print(
            f"[gc-probe] collections per generation {counts}, seconds {rounded}, longest "
            f"{longest[0] * 1000:.1f} ms",
            file=sys.stderr, flush=True,
        )

    gc.callbacks.append(callback)
    atexit.register(report)


if __name__ == "__main__":
    sys.exit(main())
