"""Tensor parallelism over gloo on the CPU (two worker processes): greedy tokens equal HF
transformers' and the one-process engine's for every tiny dense architecture, including a
single key/value head (replicated on both ranks), biases on the row-parallel output projection
and a vocabulary the ranks split unevenly; a rank that dies ends the engine with a clear error
and leaves no process behind; sizes the model cannot be split by are refused at start-up."""

from __future__ import annotations

import os
import random
import signal

import pytest

from ladle import LLM, SamplingParams
from ladle.protocol.messages import EngineCoreRequest

NUM_NEW_TOKENS = 10


def _prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in (1, 6, 17, 33, 50)]


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


CASES = {
    "llama": {},
    "qwen2": {},
    "qwen3": {},
    "llama_tied": {},
    # One key/value head for two ranks: each keeps a copy. Biases everywhere (Llama's
    # attention_bias also biases o_proj, whose bias only rank 0 adds). 515 ids: 258 a rank.
    "llama_one_kv_head": dict(num_key_value_heads=1, attention_bias=True, vocab_size=515),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny_case(request, tmp_path_factory):
    from helpers.tiny_models import hf_greedy, load_hf_reference, save_tiny_model

    name = request.param
    architecture = "llama" if name == "llama_one_kv_head" else name
    folder = tmp_path_factory.mktemp(name)
    path = save_tiny_model(folder, architecture, **CASES[name])
    reference = load_hf_reference(path)
    prompts = _prompts(min(reference.config.vocab_size, 512))
    expected = [hf_greedy(reference, prompt, NUM_NEW_TOKENS) for prompt in prompts]
    return path, prompts, expected


@pytest.mark.slow
def test_two_ranks_give_hf_greedy_tokens(tiny_case):
    path, prompts, expected = tiny_case
    llm = LLM(path, tensor_parallel_size=2, cpu_kv_cache_gib=0.02, block_size=16)
    try:
        assert type(llm.engine.executor).__name__ == "MultiprocessExecutor"
        assert _greedy(llm, prompts) == expected
        stats = llm.engine.get_stats()
        assert stats.num_free_blocks == stats.num_total_blocks  # nothing leaked
    finally:
        llm.engine.executor.shutdown()


@pytest.mark.slow
def test_two_ranks_split_the_kv_cache_and_agree_on_one_pool(tiny_model_path):
    """Each rank caches its own key/value head (the tiny model has 2): half a block's bytes, so
    the same GiB holds twice the blocks of one rank's whole cache."""
    path = tiny_model_path("llama")
    single = LLM(path, cpu_kv_cache_gib=0.01, block_size=16)
    split = LLM(path, tensor_parallel_size=2, cpu_kv_cache_gib=0.01, block_size=16)
    try:
        one = single.engine.executor.info.memory_budget
        two = split.engine.executor.info.memory_budget
        assert 2 * two.block_bytes == one.block_bytes
        assert two.num_blocks == int(0.01 * 2**30 // two.block_bytes)
        # (the scheduler's total leaves out the null block every pool keeps)
        assert split.engine.get_stats().num_total_blocks == two.num_blocks - 1
    finally:
        split.engine.executor.shutdown()


@pytest.mark.slow
def test_a_dead_rank_ends_the_engine_and_leaves_no_process(tiny_model_path):
    llm = LLM(tiny_model_path("qwen3"), tensor_parallel_size=2, cpu_kv_cache_gib=0.02)
    engine = llm.engine
    processes = engine.executor._processes
    engine.add_request(
        EngineCoreRequest("r", [5, 6, 7], SamplingParams(max_tokens=200, ignore_eos=True))
    )
    engine.step()
    os.kill(processes[1].pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="rank 1 died|rank 0 failed"):
        for _ in range(400):
            engine.step()
    for process in processes:
        assert process.wait(timeout=30) is not None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            dict(tensor_parallel_size=3),
            "tensor_parallel_size=3 does not divide the number of attention heads",
        ),
        (dict(tensor_parallel_size=2, distributed_executor_backend="uni"), "need 'mp'"),
        (dict(data_parallel_size=2), "data parallelism inside one engine is not implemented"),
    ],
)
def test_sizes_and_backends_that_cannot_work_are_refused(tiny_model_path, options, message):
    with pytest.raises(ValueError, match=message):
        LLM(tiny_model_path("llama"), cpu_kv_cache_gib=0.02, **options)


def test_a_gguf_file_is_refused_on_several_ranks(tmp_path):
    from ladle.model.load_errors import ModelLoadError

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises((ModelLoadError, ValueError), match="GGUF files run on one rank"):
        LLM(str(gguf), tensor_parallel_size=2, cpu_kv_cache_gib=0.02)
