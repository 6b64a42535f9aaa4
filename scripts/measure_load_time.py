"""Time `LLM()` on the default model (process start to ready engine) for several source trees,
interleaved, in fresh processes; prints each run and the medians.

"ready" is from just before the process is spawned to the moment LLM() returns (the child
reports the wall-clock time then); "wall" adds the interpreter's exit; "cpu" is the CPU time the
process used until ready (all its threads), which other programs on the machine change less.

    python scripts/measure_load_time.py --runs 3 OLD_SRC NEW_SRC
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

PROGRAM = (
    "from ladle import LLM; LLM(); import time; print(time.process_time()); print(time.time())"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sources", nargs="+", help="folders holding the ladle package")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    timings: dict[str, list[float]] = {source: [] for source in args.sources}
    walls: dict[str, list[float]] = {source: [] for source in args.sources}
    cpus: dict[str, list[float]] = {source: [] for source in args.sources}
    for run in range(args.runs):
        for source in args.sources:
            env = {**os.environ, "PYTHONPATH": source, "OMP_NUM_THREADS": "1"}
            spawned_at = time.time()
            wall_started = time.perf_counter()
            result = subprocess.run(
                [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True
            )
            wall = time.perf_counter() - wall_started
            if result.returncode != 0:
                sys.exit(f"{source}: failed\n{result.stderr[-2000:]}")
            cpu, ready_at = (float(line) for line in result.stdout.strip().splitlines()[-2:])
            ready = ready_at - spawned_at
            timings[source].append(ready)
            walls[source].append(wall)
            cpus[source].append(cpu)
            print(
                f"run {run} {source}: ready {ready:.1f} s, cpu {cpu:.1f} s "
                f"({wall:.1f} s wall with exit)",
                flush=True,
            )
    for source, values in timings.items():
        print(
            f"median {source}: ready {statistics.median(values):.1f} s, cpu "
            f"{statistics.median(cpus[source]):.1f} s, wall "
            f"{statistics.median(walls[source]):.1f} s over {len(values)} runs"
        )


if __name__ == "__main__":
    main()
