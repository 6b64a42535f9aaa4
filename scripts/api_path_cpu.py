"""CPU time of the API process's own code per streamed token, with no HTTP server and no engine.

    PYTHONPATH=src python scripts/api_path_cpu.py --streams 128 --steps 200 --repeats 5

The real app (`build_app`: FastAPI routes, middleware, OpenAIServingCompletion's stream, SSE
chunks) and the real AsyncEngineClient reader path (wire decode, OutputProcessor, snapshots,
metrics, per-request buffers) handle S1-like streaming completions (token-id prompts, logprobs
0, ignore_eos), driven over ASGI directly: no uvicorn, no sockets. A fake engine hands the
reader one encoded EngineStep per step (one token for every stream), and the event loop runs
until every stream has written that step's chunk, so each token is its own chunk, as when the
API keeps up. The figure is process CPU time per token over the steps, the minimum of
--repeats runs: on a loaded machine the minimum is the least disturbed. It leaves out what
scripts/served_path_bench.py measures around it (uvicorn's HTTP protocol and the socket
writes), so it isolates the code this project owns.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time


class GcTime:
    """Wall time inside the cyclic collector (gc.callbacks), and collections per generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1

    def stop(self) -> None:
        gc.callbacks.remove(self._callback)


async def _lifespan_startup(app) -> asyncio.Task:
    """Runs the app's start-up; returns the lifespan task (held, or its shutdown runs)."""
    messages = [{"type": "lifespan.startup"}]
    started = asyncio.Event()

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the shutdown never comes

    async def send(message):
        if message["type"] == "lifespan.startup.complete":
            started.set()

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}}
    task = asyncio.ensure_future(app(scope, receive, send))
    await started.wait()
    return task


def _scope(path: str) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
        "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000),
    }


async def run_once(
    num_streams: int, num_steps: int, tokenizer: str | None, profiler=None
) -> dict:
    from ladle.engine.gc_policy import freeze_startup_objects
    from ladle.entrypoints.openai.server import ServerSettings, build_app
    from ladle.frontend.admission import AdmissionController
    from ladle.frontend.client import AsyncEngineClient, EngineInfo
    from ladle.frontend.metrics import ServerMetrics
    from ladle.frontend.output_processor import OutputProcessor
    from ladle.protocol import wire
    from ladle.protocol.messages import EngineCoreOutput, TokenLogprobs

    admission = AdmissionController(10**6, 10**12)
    client = AsyncEngineClient({"model": None}, ServerMetrics("m"), admission)
    if tokenizer is not None:
        from ladle.model.tokenizer import load_tokenizer

        client.tokenizer = load_tokenizer(tokenizer)
    client.info = EngineInfo(max_model_len=8192, memory_budget="", vocab_size=151_936)
    client.output_processor = OutputProcessor(client.tokenizer, (0,))
    added: list = []
    client._send = lambda message: added.extend(getattr(message, "requests", ()))
    app = build_app(client, ServerSettings(served_model_name="m"))
    lifespan = await _lifespan_startup(app)

    chunks = [0]

    async def stream(body: bytes) -> None:
        sent_body = [False]

        async def receive():
            if not sent_body[0]:
                sent_body[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # no disconnect

        async def send(message):
            if message["type"] == "http.response.body" and message.get("body"):
                chunks[0] += 1

        await app(_scope("/v1/completions"), receive, send)

    body = json.dumps({
        "model": "m", "prompt": list(range(100, 600)), "max_tokens": num_steps + 1,
        "stream": True, "logprobs": 0, "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }).encode()
    tasks = [asyncio.ensure_future(stream(body)) for _ in range(num_streams)]
    while len(added) < num_streams:
        await asyncio.sleep(0.01)
    ids = [request.request_id for request in added]
    tokens = list(range(1000, 1000 + 4096, 7))
    frames = [
        wire.encode_output(wire.EngineStep(outputs=[
            EngineCoreOutput(
                request_id, [token := tokens[(step + i) % len(tokens)]],
                new_logprobs=[TokenLogprobs(token, -1.25, 1)],
                first_token_time=time.monotonic() if step == 0 else None,
            )
            for i, request_id in enumerate(ids)
        ]))
        for step in range(num_steps)
    ]
    freeze_startup_objects()  # as AsyncEngineClient does once the engine is ready
    if profiler is not None:
        profiler.enable()
    gc_time = GcTime()
    cpu, wall = time.process_time(), time.perf_counter()
    for frame in frames:
        target = chunks[0] + num_streams
        client._apply_step(wire.decode_output(frame))
        while chunks[0] < target:
            await asyncio.sleep(0)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    gc_time.stop()
    if profiler is not None:
        profiler.disable()
    for task in [*tasks, lifespan]:
        task.cancel()
    await asyncio.gather(*tasks, lifespan, return_exceptions=True)
    tokens_out = num_steps * num_streams
    return {
        "cpu_us_per_token": cpu / tokens_out * 1e6,
        "wall_us_per_token": wall / tokens_out * 1e6,
        "gc_us_per_token": gc_time.seconds / tokens_out * 1e6,
        "gc_collections": gc_time.collections,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokenizer", default=None, help="decode with this tokenizer")
    parser.add_argument("--profile", default=None, help="cProfile the timed steps into this file")
    args = parser.parse_args()
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    runs = []
    for _ in range(args.repeats):
        runs.append(asyncio.run(run_once(args.streams, args.steps, args.tokenizer, profiler)))
    if profiler is not None:
        profiler.dump_stats(args.profile)
    best = min(runs, key=lambda r: r["cpu_us_per_token"])
    print(json.dumps({
        "streams": args.streams, "steps": args.steps, "tokenizer": args.tokenizer,
        "cpu_us_per_token_min": round(best["cpu_us_per_token"], 1),
        "cpu_us_per_token_runs": [round(r["cpu_us_per_token"], 1) for r in runs],
        "gc_us_per_token_runs": [round(r["gc_us_per_token"], 1) for r in runs],
        "gc_collections_runs": [r["gc_collections"] for r in runs],
    }))


if __name__ == "__main__":
    main()
