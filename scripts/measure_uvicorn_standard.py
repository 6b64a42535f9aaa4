"""Does `uvicorn[standard]` (uvloop's event loop, httptools' HTTP parser) serve ladle faster
than plain uvicorn (asyncio, h11)? Starts `ladle serve` on a tiny random model once per
configuration, interleaved over several rounds, on 127.0.0.1 only, and times a fixed, bounded
load against each: GET /v1/models (the HTTP stack alone) and 1-token completions (HTTP plus
the engine round trip), at a fixed concurrency. Prints each run and the medians.

    python scripts/measure_uvicorn_standard.py --rounds 3

The configurations differ only in uvicorn.Config's loop and http arguments, set in the server
process before ladle builds its config. ladle's own protocol (h11 with a request deadline) is
the "h11" one; "httptools" drops that deadline, so it is measured for information only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

CONFIGS = {
    "plain (asyncio + h11)": ("asyncio", None),
    "standard (uvloop + h11)": ("uvloop", None),
    "standard (uvloop + httptools)": ("uvloop", "httptools"),
}
SERVER_PROGRAM = """
import sys, uvicorn
loop, http = sys.argv[1], sys.argv[2]
original = uvicorn.Config
class Config(original):
    def __init__(self, *args, **kwargs):
        kwargs["loop"] = loop
        if http != "default":
            kwargs["http"] = http
        super().__init__(*args, **kwargs)
uvicorn.Config = Config
from ladle.cli import main
sys.exit(main(sys.argv[3:]))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: str, loop: str, http: str | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [
        sys.executable,
        "-c",
        SERVER_PROGRAM,
        loop,
        http or "default",
        "serve",
        model,
        "--port",
        str(port),
        "--served-model-name",
        "tiny",
        "--disable-log-stats",
        "--disable-log-requests",
        "--uvicorn-log-level",
        "warning",
        "--cpu-kv-cache-gib",
        "0.05",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return process, base_url
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            sys.exit(f"server ({loop}, {http}) exited with {process.returncode}")
        time.sleep(0.5)
    process.kill()
    sys.exit("server did not start")


async def timed_load(base_url: str, kind: str, num_requests: int, concurrency: int) -> float:
    """Requests per second over a fixed number of requests; every one must succeed."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(num_requests):
        queue.put_nowait(index)
    body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 1}

    async def worker(client: httpx.AsyncClient) -> None:
        while True:
            try:
                queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if kind == "models":
                response = await client.get("/v1/models")
            else:
                response = await client.post("/v1/completions", json=body)
            response.raise_for_status()

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60) as client:
        await client.get("/v1/models")  # connections warm
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        return num_requests / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    sys.path.insert(0, os.getcwd())
    from tests.helpers.tiny_models import save_tiny_model

    model = save_tiny_model(tempfile.mkdtemp(prefix="ladle-uvicorn-"), "llama")
    results: dict[tuple[str, str], list[float]] = {}
    for round_index in range(args.rounds):
        for name, (loop, http) in CONFIGS.items():
            process, base_url = start_server(model, loop, http)
            try:
                for kind in ("models", "completions"):
                    rate = asyncio.run(timed_load(base_url, kind, args.requests, args.concurrency))
                    results.setdefault((name, kind), []).append(rate)
                    print(f"round {round_index} {name} {kind}: {rate:.0f} req/s", flush=True)
            finally:
                process.terminate()
                process.wait(timeout=60)
    for (name, kind), rates in results.items():
        runs = ", ".join(f"{rate:.0f}" for rate in rates)
        print(f"median {name} {kind}: {statistics.median(rates):.0f} req/s ({runs})")


if __name__ == "__main__":
    main()
