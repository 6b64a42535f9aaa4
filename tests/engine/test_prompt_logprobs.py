"""prompt_logprobs against Hugging Face transformers (float32 on the CPU): every prompt token's
logprob, rank and top candidates, with the prompt prefilled in several chunks, next to other
requests, and again once its blocks sit in the prefix cache (such requests skip the cache)."""

from __future__ import annotations

import pytest
import torch

from ladle import LLM, SamplingParams
from ladle.engine.prompt_logprobs import PromptLogprobsCollector
from ladle.protocol.messages import EngineCoreOutput, TokenLogprobs
from ladle.worker.prompt_logprobs import PromptLogprobsChunk
from tests.helpers.tiny_models import load_hf_reference

PROMPT = list(range(5, 45))  # 40 tokens: three chunks of at most 16
TOP = 3


@pytest.fixture(scope="module")
def llm_and_reference(tiny_model_path):
    path = tiny_model_path("llama")
    llm = LLM(
        path, dtype="float32", cpu_kv_cache_gib=0.05, max_num_batched_tokens=16, block_size=16
    )
    with torch.no_grad():
        logits = load_hf_reference(path)(torch.tensor([PROMPT])).logits[0].float()
    return llm, torch.log_softmax(logits, dim=-1)


def _check_against_reference(prompt_logprobs, reference: torch.Tensor) -> None:
    assert len(prompt_logprobs) == len(PROMPT) and prompt_logprobs[0] is None
    for position in range(1, len(PROMPT)):
        entry = prompt_logprobs[position]
        row = reference[position - 1]  # the logits of the token before predict this one
        token = PROMPT[position]
        assert entry[token].logprob == pytest.approx(row[token].item(), abs=1e-4)
        assert entry[token].rank == int((row > row[token]).sum()) + 1
        top_values, top_ids = row.topk(TOP)
        for rank, (token_id, value) in enumerate(zip(top_ids.tolist(), top_values.tolist()), 1):
            assert token_id in entry
            assert entry[token_id].logprob == pytest.approx(value, abs=1e-4)
            if token_id != token:
                assert entry[token_id].rank == rank
        assert len(entry) in (TOP, TOP + 1)  # the prompt's token, if not in the top k


def test_prompt_logprobs_match_transformers_over_chunks_and_cache(llm_and_reference) -> None:
    llm, reference = llm_and_reference
    params = SamplingParams(max_tokens=2, prompt_logprobs=TOP, temperature=0)
    others = SamplingParams(max_tokens=3, temperature=0)
    first, neighbour = llm.generate(
        [{"prompt_token_ids": PROMPT}, {"prompt_token_ids": PROMPT[:20]}],
        [params, others],
        use_tqdm=False,
    )
    _check_against_reference(first.prompt_logprobs, reference)
    assert neighbour.prompt_logprobs is None
    # A plain request caches the prompt's blocks; asking again still computes every position.
    llm.generate({"prompt_token_ids": PROMPT}, others, use_tqdm=False)
    again = llm.generate({"prompt_token_ids": PROMPT}, params, use_tqdm=False)[0]
    assert again.num_cached_tokens == 0
    _check_against_reference(again.prompt_logprobs, reference)
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_prompt_logprobs_zero_gives_the_prompt_token_only(llm_and_reference) -> None:
    llm, reference = llm_and_reference
    output = llm.generate(
        {"prompt_token_ids": PROMPT},
        SamplingParams(max_tokens=1, prompt_logprobs=0),
        use_tqdm=False,
    )[0]
    for position in range(1, len(PROMPT)):
        assert list(output.prompt_logprobs[position]) == [PROMPT[position]]


def test_bad_prompt_logprobs_are_named() -> None:
    for value in (-1, 21, 1.5):
        with pytest.raises(ValueError, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=value)


def test_collector_keeps_positions_and_forgets_aborted() -> None:
    def entry(token_id: int) -> TokenLogprobs:
        return TokenLogprobs(token_id=token_id, logprob=-1.0, rank=1)

    collector = PromptLogprobsCollector()
    collector.add({"a": PromptLogprobsChunk(4, 1, [entry(1), entry(2)])})
    # recomputed after a preemption: the same positions again, then the rest
    collector.add(
        {
            "a": PromptLogprobsChunk(4, 1, [entry(1), entry(2)]),
            "b": PromptLogprobsChunk(3, 1, [entry(9)]),
        }
    )
    collector.add({"a": PromptLogprobsChunk(4, 3, [entry(3)])})
    collector.discard(["b"])
    outputs = [EngineCoreOutput("a", [7]), EngineCoreOutput("b", [8])]
    collector.attach(outputs)
    assert [e if e is None else e.token_id for e in outputs[0].prompt_logprobs] == [None, 1, 2, 3]
    assert outputs[1].prompt_logprobs is None
