"""The served-path harness's stand-ins: the paced engine and the stub SSE server."""

from __future__ import annotations

import asyncio
import socket

from ladle.bench.paced_engine import PacedEngine
from ladle.bench.serve_client import BenchRequest, send_request
from ladle.bench.serve_stats import RequestRecord
from ladle.bench.sse_stub_server import serve
from ladle.protocol.messages import EngineCoreRequest
from ladle.sampling.params import SamplingParams


def _request(request_id: str, max_tokens: int, logprobs: int | None) -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(max_tokens=max_tokens, logprobs=logprobs),
        eos_token_ids=(0,),
        arrival_time=0.0,
    )


def test_paced_engine_gives_every_running_request_one_token_a_step():
    token_ids = [11, 12, 13, 14]
    engine = PacedEngine(0.0, token_ids)
    engine.add_request(_request("a", 3, logprobs=0))
    engine.add_request(_request("b", 1, logprobs=None))
    engine.add_request(_request("c", 5, logprobs=None))
    first = engine.step()
    assert [o.request_id for o in first] == ["a", "b", "c"]
    assert all(len(o.new_token_ids) == 1 and o.new_token_ids[0] in token_ids for o in first)
    assert all(o.first_token_time is not None for o in first)
    assert first[0].new_logprobs[0].token_id == first[0].new_token_ids[0]
    assert first[1].new_logprobs is None and first[1].finish_reason == "length"
    assert engine.abort_requests(["c", "gone"])[0].finish_reason == "abort"
    second, third = engine.step(), engine.step()
    assert [(o.request_id, o.finish_reason) for o in second + third] == [
        ("a", None), ("a", "length")
    ]
    assert second[0].first_token_time is None
    assert not engine.has_unfinished_requests() and engine.step() == []


def test_stub_server_streams_max_tokens_chunks_that_the_bench_client_counts():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def run() -> list[RequestRecord]:
        import aiohttp

        ready = asyncio.Event()
        server = asyncio.create_task(serve("127.0.0.1", port, 0.001, ready))
        await ready.wait()
        try:
            async with aiohttp.ClientSession() as session:
                requests = [BenchRequest("w", 3, n, prompt=[1, 2, 3]) for n in (1, 5, 9)]
                return await asyncio.gather(*(
                    send_request(session, f"http://127.0.0.1:{port}", request,
                                 RequestRecord(i, "w", 0.0), "stub", 0.0, {}, 0.0)
                    for i, request in enumerate(requests)
                ))
        finally:
            server.cancel()

    records = asyncio.run(run())
    assert [r.error for r in records] == [None] * 3
    assert [(r.output_tokens, r.num_chunks, len(r.itl)) for r in records] == [
        (1, 1, 0), (5, 5, 4), (9, 9, 8)
    ]


def test_a_stalled_stream_ends_its_record_with_a_timeout_not_the_run():
    """--request-timeout bounds each wait between reads (not the whole stream): a server that
    stops sending fails that request alone, with the reason."""
    from types import SimpleNamespace

    from ladle.bench.serve_run import open_stream_session
    from ladle.bench.sse_stub_server import STREAM_HEAD, TOKEN_CHUNK

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(STREAM_HEAD + TOKEN_CHUNK)  # one token, then nothing
        await reader.read()  # until the client gives up and closes
        writer.close()

    async def run() -> RequestRecord:
        server = await asyncio.start_server(stall, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, open_stream_session(SimpleNamespace(request_timeout=0.3)) as session:
            request = BenchRequest("w", 3, 4, prompt=[1, 2, 3])
            return await send_request(session, f"http://127.0.0.1:{port}", request,
                                      RequestRecord(0, "w", 0.0), "stub", 0.0, {}, 0.0)

    record = asyncio.run(run())
    assert record.num_chunks == 1 and record.ttft is not None
    assert record.error is not None and "Timeout" in record.error
