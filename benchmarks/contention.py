"""Throughput next to busy processes: how much of its quiet speed ladle keeps when other
programs use the CPU (a laptop with a browser and an editor open).

For each case it measures generated tokens per second alternately quiet and with K busy
processes (pure-Python spin loops, one core each) running beside it, so the two conditions see
the same background drift; medians of the runs and the contended / quiet ratio are printed and
written as JSON. With K busy processes on C cores, a fair scheduler leaves the engine about
C / (C + K) of the machine if its threads keep C cores busy (0.5 for K=2 on 2 cores).

    # the default model; the offline API and `ladle serve`, batch 1 and 32 concurrent:
    python benchmarks/contention.py --busy 2 --runs 3
    # llama.cpp (llama-cpp-python) on the same GGUF, same conditions:
    python benchmarks/contention.py --busy 2 --runs 3 --cases llamacpp-1
    # a short smoke run on random weights:
    python benchmarks/contention.py --model tiny-llama --load-format dummy --busy 1 \\
        --runs 1 --output-len 4 --cases offline-1 serve-2

Cases: offline-B (LLM.generate on B prompts at once), serve-B (B concurrent requests to a
`ladle serve` started here), llamacpp-1 (llama_cpp.Llama, one prompt). Every request is a
seeded random token-id prompt generating exactly --output-len tokens (EOS ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

SPIN_CODE = "while True: pass"


@contextlib.contextmanager
def busy_processes(count: int, own_sessions: bool = True) -> Iterator[list[subprocess.Popen]]:
    """`count` processes that each keep one core busy until the block ends.

    own_sessions: start each in a session of its own, as a browser or an editor runs. Linux's
    autogroup scheduling (on by default on desktops) shares the CPU between sessions first, so
    a busy process started in the benchmark's own session would take its time from ladle's
    share alone instead of competing with it as another program does.
    """
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", SPIN_CODE],
            stdin=subprocess.DEVNULL,
            start_new_session=own_sessions,
        )
        for _ in range(count)
    ]
    try:
        time.sleep(0.5 if count else 0.0)  # let them get going before the measurement starts
        yield processes
    finally:
        for process in processes:
            process.kill()
        for process in processes:
            process.wait()


# Prompt ids are drawn below this: valid in every vocabulary (tiny test models have 512 ids),
# and the cost of a step does not depend on which ids it sees.
PROMPT_ID_LIMIT = 500


def make_prompts(num_prompts: int, prompt_len: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(10, PROMPT_ID_LIMIT) for _ in range(prompt_len)] for _ in range(num_prompts)
    ]


# ----- the engines measured: each returns a function run() -> (seconds, tokens generated) -----


def offline_case(llm, batch: int, prompt_len: int, output_len: int, seed: int) -> Callable:
    from ladle import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    counter = iter(range(1 << 30))

    def run() -> tuple[float, int]:
        # Fresh prompts each run: a prefix-cache hit would skip the prefill of a repeat.
        prompts = make_prompts(batch, prompt_len, seed + next(counter))
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        return elapsed, sum(len(o.outputs[0].token_ids) for o in outputs)

    return run


def serve_case(base_url: str, batch: int, prompt_len: int, output_len: int, seed: int) -> Callable:
    import httpx

    counter = iter(range(1 << 30))

    async def one(client: httpx.AsyncClient, prompt: list[int]) -> int:
        response = await client.post(
            f"{base_url}/v1/completions",
            json={
                "prompt": prompt,
                "max_tokens": output_len,
                "temperature": 0.0,
                "ignore_eos": True,
            },
        )
        response.raise_for_status()
        return response.json()["usage"]["completion_tokens"]

    async def all_at_once(prompts: list[list[int]]) -> int:
        async with httpx.AsyncClient(timeout=3600) as client:
            return sum(await asyncio.gather(*(one(client, p) for p in prompts)))

    def run() -> tuple[float, int]:
        prompts = make_prompts(batch, prompt_len, seed + next(counter))
        started = time.perf_counter()
        generated = asyncio.run(all_at_once(prompts))
        return time.perf_counter() - started, generated

    return run


def llamacpp_case(gguf_path: str, prompt_len: int, output_len: int, seed: int) -> Callable:
    from llama_cpp import Llama

    llm = Llama(model_path=gguf_path, n_ctx=2048, verbose=False, seed=seed)
    counter = iter(range(1 << 30))

    def run() -> tuple[float, int]:
        prompt = make_prompts(1, prompt_len, seed + next(counter))[0]
        llm.reset()
        started = time.perf_counter()
        generated = 0
        for token in llm.generate(prompt, top_k=1, reset=True):
            generated += 1
            if generated >= output_len:
                break
            del token
        return time.perf_counter() - started, generated

    return run


@contextlib.contextmanager
def ladle_server(model_args: list[str]) -> Iterator[str]:
    """`ladle serve` on a free loopback port; yields its base URL."""
    import httpx

    # Its per-request log lines go to a pipe drained below.
    command = [sys.executable, "-m", "ladle.cli", "serve", *model_args, "--port", "0"]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        base_url = None
        for line in process.stdout:
            if match := re.search(r"serving .* on (http://127\.0\.0\.1:\d+)", line):
                base_url = match.group(1)
                break
        if base_url is None:
            raise RuntimeError(f"ladle serve did not start (exit {process.wait()})")
        # Keep draining its output so a chatty server never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
        while httpx.get(f"{base_url}/health", timeout=10).status_code != 200:
            time.sleep(0.2)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ----- the measurement loop -----------------------------------------------------------------


def measure(
    run: Callable, num_busy: int, num_runs: int, label: str, own_sessions: bool = True
) -> dict:
    """Alternate quiet and contended runs (after one warm-up run); medians and their ratio."""
    run()  # warm-up: first-call costs (allocations, lazy imports) are not throughput
    quiet: list[float] = []
    contended: list[float] = []
    for index in range(num_runs):
        # Alternate which condition goes first, so a drift in the background hits both.
        order = (0, num_busy) if index % 2 == 0 else (num_busy, 0)
        for count in order:
            with busy_processes(count, own_sessions):
                seconds, tokens = run()
            (contended if count else quiet).append(tokens / seconds)
            print(
                f"  {label}: {'busy=' + str(count):8s} {tokens} tokens in {seconds:.2f}s = "
                f"{tokens / seconds:.2f} tok/s",
                flush=True,
            )
    quiet_median = statistics.median(quiet)
    contended_median = statistics.median(contended)
    return {
        "case": label,
        "num_busy": num_busy,
        "busy_in_own_sessions": own_sessions,
        "quiet_tok_s": quiet,
        "contended_tok_s": contended,
        "quiet_median": quiet_median,
        "contended_median": contended_median,
        "ratio": contended_median / quiet_median,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded default model")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the engine")
    parser.add_argument(
        "--busy-in-this-session",
        action="store_true",
        help="start the busy processes in the benchmark's own session (by default each gets "
        "its own, as another program has; see busy_processes)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument(
        "--cases", nargs="+", default=["offline-1", "offline-32", "serve-1", "serve-32"]
    )
    parser.add_argument("--cpu-kv-cache-gib", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    own_sessions = not args.busy_in_this_session
    model = args.model
    if model is None and args.load_format != "dummy":
        from ladle.model.default_model import resolve_default_model

        model = str(resolve_default_model())
    engine_options = {"load_format": args.load_format, "cpu_kv_cache_gib": args.cpu_kv_cache_gib}
    results = []
    batches = {
        kind: [int(c.split("-")[1]) for c in args.cases if c.startswith(kind + "-")]
        for kind in ("offline", "serve", "llamacpp")
    }
    print(
        f"contention bench: {os.cpu_count()} cores, {args.busy} busy processes, "
        f"{args.runs} runs, prompts of {args.prompt_len} tokens, {args.output_len} generated",
        flush=True,
    )
    if batches["offline"]:
        from ladle import LLM

        llm = LLM(model, **engine_options)
        for batch in batches["offline"]:
            run = offline_case(llm, batch, args.prompt_len, args.output_len, args.seed)
            results.append(measure(run, args.busy, args.runs, f"offline-{batch}", own_sessions))
        del llm
    if batches["serve"]:
        model_args = [model] if model else []
        model_args += [
            "--load-format",
            args.load_format,
            "--cpu-kv-cache-gib",
            str(args.cpu_kv_cache_gib),
        ]
        with ladle_server(model_args) as base_url:
            for batch in batches["serve"]:
                run = serve_case(base_url, batch, args.prompt_len, args.output_len, args.seed)
                results.append(measure(run, args.busy, args.runs, f"serve-{batch}", own_sessions))
    for batch in batches["llamacpp"]:
        if batch != 1:
            raise SystemExit("llamacpp cases run one prompt at a time: llamacpp-1")
        run = llamacpp_case(model, args.prompt_len, args.output_len, args.seed)
        results.append(measure(run, args.busy, args.runs, "llamacpp-1", own_sessions))
    print(f"\n{'case':12s} {'quiet tok/s':>12s} {'busy tok/s':>12s} {'kept':>6s}")
    for result in results:
        print(
            f"{result['case']:12s} {result['quiet_median']:12.2f} "
            f"{result['contended_median']:12.2f} {result['ratio']:6.0%}"
        )
    if args.output_json:
        with open(args.output_json, "w") as file:
            json.dump(results, file, indent=1)
    return results


if __name__ == "__main__":
    main()
