"""Traffic for the reliability suite: a seeded mix of chat and completion requests, streaming
and not, sent by N concurrent clients, each outcome recorded (status, finish reason, latency)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import httpx

WORDS = ["the", "river", "engine", "token", "paged", "cache", "quiet", "morning", "serves",
         "many", "people", "at", "once", "light", "blue", "stone", "bridge", "over"]


@dataclass
class Outcome:
    status: int
    finish_reason: str | None
    latency_s: float
    error: str | None = None
    retry_after: str | None = None  # the Retry-After header of a 429


def make_request(rng: random.Random, max_tokens: int = 4) -> tuple[str, dict]:
    """(path, body) of one request of the mix: short prompts and outputs, so hundreds of
    requests fit a CI budget on two CPU cores; what is tested is that none is lost."""
    text = " ".join(rng.choice(WORDS) for _ in range(rng.choice([1, 3, 8])))
    body = {"max_tokens": rng.randint(1, max_tokens), "temperature": rng.choice([0, 0.7]),
            "stream": rng.random() < 0.5}
    if rng.random() < 0.5:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": text}]}
    return "/v1/completions", {**body, "prompt": text}


async def send(http: httpx.AsyncClient, path: str, body: dict) -> Outcome:
    """One request; a stream is read to its end. Never raises: failures are outcomes."""
    started = time.monotonic()
    finish_reason = None
    try:
        if not body.get("stream"):
            response = await http.post(path, json=body)
            if response.status_code == 200:
                finish_reason = response.json()["choices"][0]["finish_reason"]
            return Outcome(response.status_code, finish_reason, time.monotonic() - started,
                           None if response.status_code == 200 else response.text,
                           response.headers.get("Retry-After"))
        async with http.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return Outcome(response.status_code, None, time.monotonic() - started, text,
                               response.headers.get("Retry-After"))
            error = None
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    error = event["error"]["message"]
                for choice in event.get("choices", []):
                    finish_reason = choice.get("finish_reason") or finish_reason
            return Outcome(200, finish_reason, time.monotonic() - started, error)
    except httpx.HTTPError as failure:
        return Outcome(0, None, time.monotonic() - started, f"{type(failure).__name__}: {failure}")


async def run_clients(
    base_url: str, num_requests: int, num_clients: int, seed: int = 0, max_tokens: int = 4,
    timeout_s: float = 120.0, outcomes: list[Outcome] | None = None,
) -> list[Outcome]:
    """num_requests requests of the mix from num_clients concurrent clients. outcomes: a list to
    append to as requests end (for a watcher in another thread); returned."""
    rng = random.Random(seed)
    requests = [make_request(rng, max_tokens) for _ in range(num_requests)]
    outcomes = [] if outcomes is None else outcomes
    limits = httpx.Limits(max_connections=num_clients)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits) as http:

        async def client() -> None:
            while requests:
                path, body = requests.pop()
                outcomes.append(await send(http, path, body))

        await asyncio.gather(*(client() for _ in range(num_clients)))
    return outcomes


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")
