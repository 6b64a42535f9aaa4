"""Seconds each start-up import chain takes: a fresh interpreter per run, the median of N.

    python scripts/import_time.py [--runs 5] [--importtime CHAIN]

Chains (what each process imports before it can do its first useful work):
  serve-help    `ladle serve --help`: the CLI parser with every subcommand
  offline       the offline `LLM(...)` path (what scripts/startup_profile.py times as imports)
  api-process   `ladle serve`'s API process, up to spawning the engine core
  engine-core   the engine-core process: the spawn target and what it imports to build the
                engine
--importtime CHAIN prints that chain's 25 slowest modules (python -X importtime, cumulative).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CHAINS = {
    "serve-help": "import sys; sys.argv = ['ladle', 'serve', '--help']\n"
    "from ladle.cli.main import main\n"
    "try:\n    main()\nexcept SystemExit:\n    pass",
    "offline": "import ladle.engine.engine_core, ladle.model.loader, ladle.worker.cuda_graphs, "
    "ladle.worker.model_runner\nfrom ladle import LLM",
    "api-process": "import ladle.cli.main\nfrom ladle.cli import serve as cli_serve\n"
    "from ladle.frontend.client import AsyncEngineClient\n"
    "from ladle.entrypoints.openai.server import build_app\n"
    "from ladle.entrypoints.openai.live_stats import LiveStatsLogger",
    "engine-core": "import ladle.cli.main, ladle.engine.core_process\n"
    "from ladle.engine.engine_core import EngineCore\n"
    "from ladle.frontend.tokenizer_source import resolve_tokenizer_source\n"
    "from ladle.model.generation_defaults import sampling_defaults_of\n"
    "import ladle.model.loader, ladle.model.models.registry",
}


def time_chain(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def print_slowest(code: str, count: int = 25) -> None:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    rows = []
    for line in result.stderr.splitlines()[1:]:
        # "import time: <self us> | <cumulative us> | <indented module name>"
        self_us, cumulative_us, name = line.split(":", 1)[1].split("|")
        rows.append((int(cumulative_us), int(self_us), name.rstrip()))
    for cumulative_us, self_us, name in sorted(rows, reverse=True)[:count]:
        print(f"{cumulative_us / 1e6:7.3f} s  (self {self_us / 1e6:6.3f})  {name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--importtime", choices=sorted(CHAINS), default=None)
    args = parser.parse_args()
    if args.importtime:
        print_slowest(CHAINS[args.importtime])
        return
    for name, code in CHAINS.items():
        seconds = [time_chain(code) for _ in range(args.runs)]
        print(
            f"{name:12s} median {statistics.median(seconds):.2f} s  "
            f"(min {min(seconds):.2f}, max {max(seconds):.2f}, {args.runs} runs)"
        )


if __name__ == "__main__":
    main()
