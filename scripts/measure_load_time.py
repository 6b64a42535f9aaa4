"""Time `LLM()` on the default model (process start to ready engine) for several source trees,
interleaved, in fresh processes; prints each run and the medians.

"ready" is from just before the process is spawned to the moment LLM() returns (the child
reports the wall-clock time then); "wall" adds the interpreter's exit; "cpu" is the CPU time the
process used until ready (all its threads), which other programs on the machine change less.

    python scripts/measure_load_time.py --runs 3 OLD_SRC NEW_SRC
    python scripts/measure_load_time.py --serve --runs 3 OLD_SRC NEW_SRC

--serve times `ladle serve` instead: from spawning it to its first 200 on /health (the engine
process loaded and warm, the API process holding the tokenizer, the port open); then stops it.
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


def time_serve_ready(source: str) -> float:
    import socket
    import urllib.error
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": source, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "ladle", "serve", "--port", str(port), "--stats-interval", "0"]
    started = time.perf_counter()
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        return time.perf_counter() - started
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        sys.exit(f"{source}: ladle serve exited with {process.returncode}")
    finally:
        process.terminate()
        process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sources", nargs="+", help="folders holding the ladle package")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help="time `ladle serve` to /health")
    args = parser.parse_args()
    if args.serve:
        serve_timings: dict[str, list[float]] = {source: [] for source in args.sources}
        for run in range(args.runs):
            for source in args.sources:
                ready = time_serve_ready(source)
                serve_timings[source].append(ready)
                print(f"run {run} {source}: serving after {ready:.1f} s", flush=True)
        for source, values in serve_timings.items():
            print(f"median {source}: serving after {statistics.median(values):.1f} s")
        return
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
