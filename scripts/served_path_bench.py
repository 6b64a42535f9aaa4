"""Does the API process keep up? `ladle serve`'s front end against an engine of known speed.

    python scripts/served_path_bench.py --concurrency 32 128 256 --step-ms 10 --runs 3

The real API process (FastAPI app, AsyncEngineClient, detokenization of the default model's
tokenizer, stop checks, SSE) serves streaming /v1/completions, but its engine-core process is a
paced stand-in: every `--step-ms` it gives each running request one token (ids of real text, so
the detokenizer meets real words) until max_tokens, through the real EngineCoreLoop and ZMQ
wire. The engine's step time is therefore exact, and the inter-token times the clients see show
what the front end adds: the issue-8 criterion is the served ITL within 10% of the step time.

Run it with PYTHONPATH pointing at different source trees to compare them (same machine, same
load, interleaved); on a shared machine take medians of several runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import sys
import time

STEP_MS_ENV = "LADLE_PACED_STEP_MS"
TOKENIZER_ENV = "LADLE_PACED_TOKENIZER"


class PacedEngine:
    """EngineCore's interface as EngineCoreLoop uses it, one token per request per step."""

    def __init__(self, step_s: float, token_ids: list[int]) -> None:
        from ladle.engine.messages import SchedulerStats

        self.step_s = step_s
        self.token_ids = token_ids
        self.running: dict[str, list[int]] = {}  # request id -> [num generated, max_tokens]
        self.next_step = time.perf_counter()
        self.stats = SchedulerStats()
        self.step_durations: list[float] = []

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def add_request(self, request) -> None:
        self.running[request.request_id] = [0, request.sampling_params.max_tokens or 16]

    def abort_requests(self, request_ids):
        from ladle.engine.messages import EngineCoreOutput

        outputs = []
        for request_id in request_ids:
            if self.running.pop(request_id, None) is not None:
                outputs.append(EngineCoreOutput(request_id, [], finish_reason="abort"))
        return outputs

    def step(self):
        from ladle.engine.messages import EngineCoreOutput

        now = time.perf_counter()
        if self.next_step > now:
            time.sleep(self.next_step - now)
        started = time.perf_counter()
        self.next_step = max(self.next_step + self.step_s, started)
        outputs = []
        for request_id, progress in list(self.running.items()):
            token = self.token_ids[(hash(request_id) + progress[0]) % len(self.token_ids)]
            progress[0] += 1
            finished = progress[0] >= progress[1]
            outputs.append(
                EngineCoreOutput(
                    request_id,
                    [token],
                    finish_reason="length" if finished else None,
                    first_token_time=time.monotonic() if progress[0] == 1 else None,
                )
            )
            if finished:
                del self.running[request_id]
        self.step_durations.append(time.perf_counter() - started)
        return outputs

    def get_stats(self):
        self.stats.num_running_reqs = len(self.running)
        return self.stats


def paced_engine_core(options_json: str, input_address: str, output_address: str, parent: int):
    """The engine-core process entry (the same signature as run_engine_core)."""
    import zmq

    from ladle.engine import wire
    from ladle.engine.core_process import EngineCoreLoop
    from ladle.engine.tokenizer import load_tokenizer
    from ladle.model.default_model import resolve_default_model
    from ladle.model.loader import _dummy_arch_config

    context = zmq.Context()
    input_socket = context.socket(zmq.PULL)
    input_socket.connect(input_address)
    output_socket = context.socket(zmq.PUSH)
    output_socket.connect(output_address)
    source = os.environ.get(TOKENIZER_ENV) or str(resolve_default_model())
    arch, _ = _dummy_arch_config(None, {})
    tokenizer = load_tokenizer(source, arch).hf_tokenizer
    with open(__file__, encoding="utf-8") as handle:
        token_ids = tokenizer.encode(handle.read() * 4, add_special_tokens=False)
    engine = PacedEngine(float(os.environ[STEP_MS_ENV]) / 1000, token_ids)
    ready = wire.EngineReady(
        max_model_len=8192, tokenizer_source=source, arch=arch, memory_budget="paced stand-in"
    )
    output_socket.send(wire.encode_output(ready))
    EngineCoreLoop(engine, input_socket, output_socket, parent).run()
    os._exit(0)


async def _stream_one(host: str, port: int, body: bytes) -> dict:
    """One streaming completion over a raw connection; the times of its content chunks.

    A bare asyncio reader, not httpx: at hundreds of streams a full HTTP client parsing every
    line in one Python process falls behind the server and shows its own lag as the server's.
    """
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    await writer.drain()
    status = await reader.readline()
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    times = []
    while line := await reader.readline():
        if not line.startswith(b"data: "):
            continue  # chunk sizes and blank lines
        if line.startswith(b"data: [DONE]"):
            break
        # A content chunk carries text; the usage chunk and an empty finishing one do not.
        if b'"text":""' not in line and b'"choices":[]' not in line:
            times.append(time.perf_counter())
    writer.close()
    error = None if b" 200 " in status else status.decode(errors="replace").strip()
    if error is None and not times:
        error = "no content"
    return {"error": error, "itl": [b - a for a, b in zip(times, times[1:])], "tokens": len(times)}


def run_load(
    base_url: str, concurrency: int, max_tokens: int, requests_per_slot: int
) -> tuple[list[dict], float]:
    """concurrency clients, each streaming completions one after another; plain records."""
    host, port = base_url.removeprefix("http://").split(":")
    body = json.dumps(
        {
            "model": "paced",
            "prompt": "Tell me a story about a fox",
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
        }
    ).encode()

    async def load() -> tuple[list[dict], float]:
        records: list[dict] = []
        remaining = [concurrency * requests_per_slot]

        async def worker() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                records.append(await _stream_one(host, int(port), body))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return records, time.perf_counter() - started

    return asyncio.run(load())


async def run_level(concurrency: int, args) -> dict:
    import uvicorn

    import ladle.engine.client as client_module
    from ladle.engine.admission import AdmissionController
    from ladle.entrypoints.openai.server import ServerSettings, build_app
    from ladle.metrics import ServerMetrics

    client_module.run_engine_core = paced_engine_core  # the stand-in engine process
    metrics = ServerMetrics("paced")
    client = client_module.AsyncEngineClient(
        {"model": None}, metrics, AdmissionController(100_000, 10**9)
    )
    await client.start()
    settings = ServerSettings(served_model_name="paced", log_requests=False)
    app = build_app(client, settings)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    base_url = f"http://127.0.0.1:{port}"
    # The load runs in a process of its own: its SSE parsing must not share the API's loop.
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(1) as pool:
        records, wall = await asyncio.to_thread(
            pool.apply, run_load, (base_url, concurrency, args.max_tokens, args.requests_per_slot)
        )
    server.should_exit = True
    await serving
    failed = [r for r in records if r["error"]]
    itls = sorted(i * 1000 for r in records if not r["error"] for i in r["itl"])
    tokens = sum(r["tokens"] for r in records if not r["error"])

    def pct(q: float) -> float:
        return itls[min(len(itls) - 1, int(q / 100 * (len(itls) - 1)))] if itls else float("nan")

    return {
        "concurrency": concurrency,
        "step_ms": args.step_ms,
        "requests": len(records),
        "failed": len(failed),
        "output_tok_per_s": tokens / wall,
        "ideal_tok_per_s": concurrency * 1000 / args.step_ms,
        "itl_ms_p50": pct(50),
        "itl_ms_p90": pct(90),
        "itl_ms_p99": pct(99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 128, 256])
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests-per-slot", type=int, default=1)
    parser.add_argument("--tokenizer", default=None, help="default: the default model's")
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", default=None, help="cProfile the API process into this file")
    args = parser.parse_args()
    os.environ[STEP_MS_ENV] = str(args.step_ms)
    if args.tokenizer:
        os.environ[TOKENIZER_ENV] = os.path.abspath(args.tokenizer)
    results = []
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    for concurrency in args.concurrency:
        result = asyncio.run(run_level(concurrency, args))
        results.append(result)
        print(json.dumps(result), flush=True)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
