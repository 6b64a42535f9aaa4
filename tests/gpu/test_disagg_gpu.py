"""Prefill/decode disaggregation on two GPUs.

In one process: a producer engine on GPU 0 and a consumer on GPU 1 (the pull is a peer-to-peer
copy between the GPUs) give the one-engine tokens, in float32 and with the fp8 KV cache (which
moves as fp8 bytes). Served: `ladle serve --disaggregate 1P1D` (two engine processes, the pull
through CUDA IPC) streams the offline engine's greedy text; so do 2P1D and 1P2D on 3 GPUs."""

from __future__ import annotations

import random
import re

import httpx
import openai
import pytest
import torch

from ladle import SamplingParams
from ladle.protocol.messages import EngineCoreRequest
from tests.kv_transfer.disagg_engines import decode_request, make_engine, tokens_of

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
)
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=16, ignore_eos=True)


def _prompts() -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(3, 500) for _ in range(rng.randrange(1, 90))] for _ in range(12)]


def _run(engine, requests: list[EngineCoreRequest]) -> dict:
    # Two engines in one process: each step runs with its engine's GPU current (Triton
    # launches on the current device).
    with torch.cuda.device(engine.executor.grammar_device):
        for request in requests:
            engine.add_request(request)
        outputs: dict = {request.request_id: [] for request in requests}
        for _ in range(2000):
            for output in engine.step():
                outputs[output.request_id].append(output)
            if all(o and o[-1].finished for o in outputs.values()):
                return outputs
    raise AssertionError("the engine did not finish")


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_two_gpu_parity(kv_cache_dtype):
    options = dict(kv_cache_dtype=kv_cache_dtype, num_kv_blocks=512)
    single = make_engine(device="cuda:0", **options)
    producer = make_engine("kv_producer", device="cuda:0", **options)
    consumer = make_engine("kv_consumer", device="cuda:1", **options)
    prompts = _prompts()
    params = [GREEDY if i % 2 == 0 else SEEDED for i in range(len(prompts))]
    ids = [f"r{i}" for i in range(len(prompts))]
    expected = _run(single, [EngineCoreRequest(i, p, s) for i, p, s in zip(ids, prompts, params)])
    handoffs = _run(producer, [
        EngineCoreRequest(i, p, s, kv_transfer_params={"do_remote_decode": True})
        for i, p, s in zip(ids, prompts, params)
    ])
    decoded = _run(consumer, [
        decode_request(i, p, s, handoffs[i][-1]) for i, p, s in zip(ids, prompts, params)
    ])
    for request_id in ids:
        got = tokens_of(handoffs[request_id]) + tokens_of(decoded[request_id])
        assert got == tokens_of(expected[request_id]), request_id
    assert consumer.scheduler.pulls.num_blocks_pulled > 0
    producer.abort_requests(ids)
    assert producer.kv_cache_manager.num_free_blocks == single.kv_cache_manager.num_free_blocks


@pytest.mark.parametrize("layout", ["1P1D", "2P1D", "1P2D"])
def test_served_xpyd_equals_offline(tmp_path, layout):
    """Each engine on its own GPU (prefill engines first); requests sent together spread over
    the engines of each kind and stream the offline engine's text."""
    from concurrent.futures import ThreadPoolExecutor

    from helpers.tiny_models import GPU_SHAPE, save_tiny_model

    from ladle import LLM
    from tests.entrypoints.server_process import ServerProcess

    path = save_tiny_model(tmp_path, "qwen3", **GPU_SHAPE)
    prompts = ["The quick brown fox", "Hello, world! Hello,", "abc def ghi"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    llm = LLM(path, dtype="float32", num_kv_blocks=512)
    expected = [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]
    del llm
    torch.cuda.empty_cache()
    num_prefill, num_decode = (int(n) for n in layout[:-1].split("P"))
    if torch.cuda.device_count() < num_prefill + num_decode:
        pytest.skip(f"{layout} needs {num_prefill + num_decode} GPUs")
    with ServerProcess([path, "--served-model-name", "m", "--dtype", "float32",
                        "--num-kv-blocks", "512", "--disaggregate", layout]) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)

        def stream_one(prompt: str) -> tuple[str, int]:
            stream = client.completions.create(
                model="m", prompt=prompt, max_tokens=24, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            )
            got, usage = "", None
            for chunk in stream:
                usage = chunk.usage or usage
                got += "".join(choice.text or "" for choice in chunk.choices)
            return got, usage.completion_tokens

        for prompt, text in zip(prompts, expected):  # one at a time
            assert stream_one(prompt) == (text, 24)
        with ThreadPoolExecutor(len(prompts)) as pool:  # together: they spread
            assert list(pool.map(stream_one, prompts)) == [(text, 24) for text in expected]
        metrics = httpx.get(f"{server.base_url}/metrics").text
        routed = dict(re.findall(r'^ladle:engine_requests_routed_total\{[^}]*engine="([^"]+)"'
                                 r"[^}]*\} (\S+)$", metrics, re.M))
        assert len(routed) == num_prefill + num_decode
        # Streams stay on their decode engine for 24 tokens, so those spread; a tiny prompt's
        # prefill on a GPU may end before the next request arrives (then prefill 0 is idle
        # again and takes it): the CPU test checks the prefill engines' spread.
        decodes = [count for role, count in routed.items() if role.startswith("decode")]
        assert all(float(count) > 0 for count in decodes), routed
        assert sum(float(c) for r, c in routed.items() if r.startswith("prefill")) >= 2 * len(
            prompts
        ), routed
