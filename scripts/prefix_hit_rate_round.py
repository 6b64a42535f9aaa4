"""Prefix-cache hit rate behind one endpoint (issue 13): one engine, 2 replicas with prefix-aware
routing, 2 replicas round-robin, on the shared-prefix workload with 4 distinct system prompts.

Each setup gets the same total KV cache: the single engine `--num-kv-blocks 2B`, each replica B,
where B holds about two of the four system prompts (13 blocks each) plus the requests in flight.
So one engine keeps all four prompts cached; prefix-aware routing gives each replica two, which
fit; round-robin sends all four to both replicas, whose caches then evict prompts they will need
again. The hit rate is the engine's own counter, read from each endpoint's /metrics (summed over
the replicas' labelled samples): prompt tokens found in the prefix cache / prompt tokens looked up.

    python scripts/prefix_hit_rate_round.py --out /tmp/hit_rate      # ~5 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.ray_scaleout_round import Server  # noqa: E402

NUM_SYSTEM_PROMPTS = 4
MODEL_ARGS = ["--max-num-seqs", "16", "--max-model-len", "1024"]


def system_prompt(index: int) -> str:
    rules = " ".join(f"Rule {j}: answer politely and briefly about topic {j}." for j in range(14))
    return f"You are support agent {index} for the Acme rocket company. {rules}"


def workload(num_per_prompt: int, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    requests = [
        [
            {"role": "system", "content": system_prompt(p)},
            {"role": "user", "content": f"Question {q}: how do I reset my password?"},
        ]
        for p in range(NUM_SYSTEM_PROMPTS)
        for q in range(num_per_prompt)
    ]
    rng.shuffle(requests)
    return requests


def cache_counters(base_url: str) -> tuple[float, float]:
    """(hits, queries) in prompt tokens, summed over every engine behind the endpoint."""
    hits = queries = 0.0
    for line in httpx.get(f"{base_url}/metrics", timeout=30).text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total{"):
            hits += float(line.rpartition(" ")[2])
        elif line.startswith("vllm:prefix_cache_queries_total{"):
            queries += float(line.rpartition(" ")[2])
    return hits, queries


def run_setup(name: str, serve_args: list[str], options: argparse.Namespace) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    server = Server([*MODEL_ARGS, *serve_args], options.out / f"{name}_server.log", env)
    try:
        ready_s = server.wait_ready(options.start_timeout)
        base_url = f"http://127.0.0.1:{server.port}"
        model = httpx.get(f"{base_url}/v1/models", timeout=60).json()["data"][0]["id"]
        hits_before, queries_before = cache_counters(base_url)
        started = time.monotonic()

        def send(messages: list[dict]) -> None:
            answer = httpx.post(
                f"{base_url}/v1/chat/completions",
                json={"model": model, "messages": messages, "max_tokens": 1, "temperature": 0},
                timeout=300,
            )
            answer.raise_for_status()

        requests = workload(options.num_per_prompt, options.seed)
        with concurrent.futures.ThreadPoolExecutor(options.concurrency) as pool:
            list(pool.map(send, requests))
        duration_s = time.monotonic() - started
        time.sleep(0.5)  # the last step's stats reach the API process
        hits, queries = cache_counters(base_url)
        result = {
            "serve_args": serve_args,
            "num_requests": len(requests),
            "ready_s": ready_s,
            "duration_s": duration_s,
            "hit_tokens": hits - hits_before,
            "query_tokens": queries - queries_before,
            "hit_rate": (hits - hits_before) / max(queries - queries_before, 1.0),
        }
        print(f"[hit-rate] {name}: {json.dumps(result)}", flush=True)
        return result
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--blocks-per-replica", type=int, default=32, help="B (see above)")
    parser.add_argument("--num-per-prompt", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=400.0)
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    blocks = options.blocks_per_replica
    setups = {
        "single": ["--num-kv-blocks", str(2 * blocks)],
        "prefix_aware_2": ["--num-kv-blocks", str(blocks), "--replicas", "2"],
        "round_robin_2": [
            *["--num-kv-blocks", str(blocks), "--replicas", "2", "--routing", "round-robin"]
        ],
    }
    results = {name: run_setup(name, args, options) for name, args in setups.items()}
    single = results["single"]["hit_rate"]
    report = {
        "results": results,
        "prefix_aware_vs_single": results["prefix_aware_2"]["hit_rate"] / single,
        "round_robin_vs_single": results["round_robin_2"]["hit_rate"] / single,
    }
    (options.out / "hit_rate.json").write_text(json.dumps(report, indent=1))
    print(
        f"[hit-rate] single {single:.3f}, prefix-aware {results['prefix_aware_2']['hit_rate']:.3f}"
        f" (x{report['prefix_aware_vs_single']:.2f}), round-robin "
        f"{results['round_robin_2']['hit_rate']:.3f} (x{report['round_robin_vs_single']:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
