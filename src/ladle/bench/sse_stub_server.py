"""A trivial OpenAI-style SSE server: how fast can a benchmark client read, on its own?

    python -m ladle.bench.sse_stub_server --port 8124 --step-ms 7

It answers POST /v1/completions (and /v1/chat/completions) with a stream of one prebuilt chunk
per token, every --step-ms for all open streams at once (as an engine step would), max_tokens
of them, then a usage chunk and `data: [DONE]`; GET /v1/models names one model. No FastAPI, no
per-chunk JSON encoding: a timer writes bytes, so the server costs little CPU per event and a
client's inter-token times against the known step show the client's own lag alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

MODEL = "stub"
_CHUNK_BODY = (
    '{"id":"cmpl-0123456789abcdef0123456789abcdef","object":"text_completion",'
    '"created":1700000000,"model":"stub","choices":[{"index":0,"text":" word","logprobs":'
    '{"text_offset":[0],"token_logprobs":[-1.25],"tokens":[" word"],"top_logprobs":[null]},'
    '"finish_reason":null,"stop_reason":null,"prompt_logprobs":null}],"usage":null}'
)


def _http_chunk(payload: bytes) -> bytes:
    """One chunk of HTTP/1.1 chunked transfer encoding."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


TOKEN_CHUNK = _http_chunk(b"data: " + _CHUNK_BODY.encode() + b"\n\n")
END_OF_BODY = b"0\r\n\r\n"
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _json_response(status: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (status.encode(), len(data), data)
    )


def _closing_chunks(num_tokens: int) -> bytes:
    usage = {"prompt_tokens": 1, "completion_tokens": num_tokens, "total_tokens": num_tokens + 1}
    final = {"id": "cmpl-0", "object": "text_completion", "created": 1700000000, "model": MODEL,
             "choices": [], "usage": usage}
    return (
        _http_chunk(b"data: " + json.dumps(final).encode() + b"\n\n")
        + _http_chunk(b"data: [DONE]\n\n")
        + END_OF_BODY
    )


class _Stream:
    __slots__ = ("transport", "remaining", "total")

    def __init__(self, transport: asyncio.Transport, total: int) -> None:
        self.transport = transport
        self.remaining = total
        self.total = total


class StubServer:
    """Holds the open streams and writes one token chunk to each every step."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.streams: list[_Stream] = []
        self.num_events = 0
        self.step_lateness: list[float] = []  # seconds each step started after its due time

    async def run_steps(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            due += self.step_s
            await asyncio.sleep(max(0.0, due - loop.time()))
            now = loop.time()
            self.step_lateness.append(now - due)
            due = max(due, now - self.step_s)  # a late step does not make the next ones early
            kept = []
            for stream in self.streams:
                if stream.transport.is_closing():
                    continue
                stream.transport.write(TOKEN_CHUNK)
                self.num_events += 1
                stream.remaining -= 1
                if stream.remaining > 0:
                    kept.append(stream)
                else:
                    stream.transport.write(_closing_chunks(stream.total))
            self.streams = kept


class _Connection(asyncio.Protocol):
    def __init__(self, server: StubServer) -> None:
        self.server = server
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            end = head_end + 4 + length
            if len(self.buffer) < end:
                return
            body, self.buffer = self.buffer[head_end + 4 : end], self.buffer[end:]
            self._answer(head.split(" ", 2), body)

    def _answer(self, request_line: list[str], body: bytes) -> None:
        method, path = request_line[0], request_line[1]
        if method == "GET" and path == "/v1/models":
            self.transport.write(_json_response("200 OK", {"data": [{"id": MODEL}]}))
        elif method == "POST" and path.startswith("/v1/"):
            max_tokens = int(json.loads(body).get("max_tokens") or 16)
            self.transport.write(STREAM_HEAD)
            self.server.streams.append(_Stream(self.transport, max_tokens))
        else:
            self.transport.write(_json_response("404 Not Found", {"error": "not found"}))


async def serve(host: str, port: int, step_s: float, ready: asyncio.Event | None = None) -> None:
    server = StubServer(step_s)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: _Connection(server), host, port, backlog=1024)
    stepping = asyncio.create_task(server.run_steps())
    if ready is not None:
        ready.set()
    try:
        await listener.serve_forever()
    finally:
        stepping.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8124)
    parser.add_argument("--step-ms", type=float, default=7.0)
    args = parser.parse_args()
    print(f"[stub] SSE on http://{args.host}:{args.port}, a token every {args.step_ms} ms",
          flush=True)
    start = time.perf_counter()
    try:
        try:
            import uvloop  # optional: not a dependency of ladle

            uvloop.run(serve(args.host, args.port, args.step_ms / 1000))
        except ImportError:
            asyncio.run(serve(args.host, args.port, args.step_ms / 1000))
    except KeyboardInterrupt:
        print(f"[stub] stopped after {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
