"""The multi-process executor (one worker process, plans over ZMQ) gives exactly the tokens of
the in-process one, for plain, seeded, penalty, grammar, bad_words and logprob requests, with
synchronous and overlapped steps; a worker that dies is an engine fault with a clear error."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from ladle import LLM, SamplingParams
from ladle.protocol.messages import EngineCoreRequest

PROMPTS = ["The capital of France is", "Once upon a time", "A person as JSON:", "Fruits:"]


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.8, seed=5, max_tokens=16, repetition_penalty=1.2),
        SamplingParams(
            temperature=0,
            max_tokens=24,
            structured_outputs={"json": SCHEMA},
        ),
        SamplingParams(temperature=0, max_tokens=16, bad_words=[" apple"]),
    ]


def _tokens(llm: LLM):
    return [
        (list(o.outputs[0].token_ids), o.outputs[0].finish_reason,
         [sorted(e) for e in o.outputs[0].logprobs or []])
        for o in llm.generate(PROMPTS, _params(), use_tqdm=False)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_multiprocess_executor_matches_in_process(async_scheduling):
    options = dict(cpu_kv_cache_gib=0.1, block_size=16, async_scheduling=async_scheduling)
    expected = _tokens(LLM(**options))
    remote = LLM(distributed_executor_backend="mp", **options)
    assert type(remote.engine.executor).__name__ == "MultiprocessExecutor"
    assert _tokens(remote) == expected
    stats = remote.engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    remote.engine.executor.shutdown()


@pytest.mark.slow
def test_a_dead_worker_is_an_engine_fault():
    llm = LLM(distributed_executor_backend="mp", cpu_kv_cache_gib=0.1)
    engine = llm.engine
    (process,) = engine.executor._processes
    engine.add_request(
        EngineCoreRequest("r", [1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True))
    )
    engine.step()
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    with pytest.raises(RuntimeError, match="worker process of rank 0 died"):
        for _ in range(100):
            engine.step()


def test_an_idle_worker_leaves_once_its_engine_is_gone():
    """A worker whose engine process died (its parent pid changed) stops waiting for plans."""
    import time
    from types import SimpleNamespace

    import zmq

    from ladle.executor.multiprocess import PARENT_CHECK_MS, _WorkerLoop

    context = zmq.Context()
    inputs, outputs = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    inputs.bind("inproc://plans")
    outputs.bind("inproc://results")
    try:
        worker = SimpleNamespace(sends_results=True, device=torch.device("cpu"))
        loop = _WorkerLoop(worker, inputs, outputs, parent_pid=os.getppid() + 1)
        started = time.monotonic()
        loop.run()  # returns instead of waiting for ever
        assert time.monotonic() - started < 3 * PARENT_CHECK_MS / 1000
    finally:
        inputs.close(linger=0)
        outputs.close(linger=0)
        context.term()
