"""Many tokens per request per step, end to end, before any real proposer exists.

A test proposer drafts the tokens a reference run (one token per step) produced, so each step
verifies up to k drafts and returns up to k + 1 tokens per request. Every result must equal the
one-token run's: greedy, seeded random sampling, penalties, a grammar, logprobs, stop strings,
EOS and max_tokens inside an accepted run of drafts. A proposer whose drafts go wrong part of the
way exercises the rollback (computed tokens and blocks given back) and must change nothing
either. Both with synchronous and with overlapped steps.
"""

from __future__ import annotations

import pytest

from ladle import LLM, SamplingParams
from ladle.core.request import Request

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "Describe a person as JSON:",
    "List three fruits:",
    "My favourite number is",
    "The weather today is",
]


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=3, max_tokens=24, ignore_eos=True, logprobs=2),
        SamplingParams(
            temperature=0,
            max_tokens=40,
            structured_outputs={"json": SCHEMA},
        ),
        SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.3, presence_penalty=0.4),
        SamplingParams(temperature=0, max_tokens=30, stop=[" is", "."]),
        SamplingParams(temperature=0, max_tokens=7),  # max_tokens inside a run of drafts
    ]


class KnownTokens:
    """Drafts the next k tokens of the reference run; wrong_after > 0 makes the draft go wrong
    after that many tokens (a token the model did not produce)."""

    def __init__(self, reference: dict[tuple[int, ...], list[int]], k: int, wrong_after: int = 0):
        self.reference = reference
        self.k = k
        self.wrong_after = wrong_after
        self.num_proposed = 0

    def propose(self, request: Request, max_num_tokens: int) -> list[int]:
        known = self.reference.get(tuple(request.prompt_token_ids), [])
        start = request.num_output_tokens
        drafts = known[start : start + min(self.k, max_num_tokens)]
        if self.wrong_after and len(drafts) > self.wrong_after:
            drafts = drafts[: self.wrong_after] + [(drafts[self.wrong_after] + 1) % 1000]
        self.num_proposed += len(drafts)
        return drafts


def _run(llm: LLM, prompts: list[str], params: list[SamplingParams]):
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [
        (
            list(o.prompt_token_ids),
            list(o.outputs[0].token_ids),
            o.outputs[0].text,
            o.outputs[0].finish_reason,
            [sorted(entry) for entry in (o.outputs[0].logprobs or [])],
        )
        for o in outputs
    ]


@pytest.fixture(scope="module")
def engines():
    return {
        mode: LLM(cpu_kv_cache_gib=0.25, block_size=4, async_scheduling=mode)
        for mode in (False, True)
    }


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize(("k", "wrong_after"), [(4, 0), (3, 1)])
def test_drafted_steps_give_the_one_token_results(engines, async_scheduling, k, wrong_after):
    llm = engines[async_scheduling]
    scheduler = llm.engine.scheduler
    scheduler.proposer = None
    reference = _run(llm, PROMPTS, _params())
    known = {tuple(prompt): tokens for prompt, tokens, *_ in reference}
    proposer = KnownTokens(known, k=k, wrong_after=wrong_after)
    multi_token_outputs = []
    original_update = scheduler.update_from_output

    def counting_update(plan, result):
        outputs = original_update(plan, result)
        multi_token_outputs.extend(o for o in outputs if len(o.new_token_ids) > 1)
        return outputs

    scheduler.proposer = proposer
    scheduler.update_from_output = counting_update
    try:
        drafted = _run(llm, PROMPTS, _params())
    finally:
        scheduler.proposer = None
        del scheduler.update_from_output
    assert proposer.num_proposed > 20
    if wrong_after == 0:
        assert len(multi_token_outputs) > 10  # steps really returned several tokens
    assert [r[:4] for r in drafted] == [r[:4] for r in reference]
    assert [r[4] for r in drafted] == [r[4] for r in reference]  # logprob candidates
    # The grammar row is valid JSON and the stop-string row ended on its stop string.
    assert reference[2][3] == "stop" and reference[4][3] == "stop"
    assert reference[5][3] == "length" and len(reference[5][1]) == 7
    stats = llm.engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks  # every block given back


def test_rejected_drafts_roll_back_computed_tokens_and_blocks():
    """A step that verified k drafts and accepted fewer: the request's computed count drops
    back over the rejected ones and blocks that held only rejected drafts are freed."""
    from ladle.config import CacheConfig, SchedulerConfig
    from ladle.core.kv_cache_manager import KVCacheManager
    from ladle.core.scheduler import Scheduler
    from ladle.protocol.step import StepResult

    manager = KVCacheManager(num_blocks=64, block_size=4, enable_caching=True)
    scheduler = Scheduler(SchedulerConfig(), CacheConfig(block_size=4), manager, 256)
    request = Request("a", [1, 2, 3], SamplingParams(max_tokens=20))
    scheduler.add_request(request)
    plan = scheduler.schedule()
    scheduler.update_from_output(plan, StepResult(["a"], [[10]]))
    assert request.num_tokens == 4 and request.num_computed_tokens == 3

    class Fixed:
        def propose(self, request, max_num_tokens):
            return [11, 12, 13, 14, 15, 16][:max_num_tokens]

    scheduler.proposer = Fixed()
    plan = scheduler.schedule()
    (scheduled,) = plan.scheduled
    assert scheduled.num_tokens == 7 and scheduled.draft_token_ids == [11, 12, 13, 14, 15, 16]
    assert manager.num_blocks_of("a") == 3  # positions 3..9 need blocks 0..2
    # While its drafts are unverified the request is not scheduled again.
    assert scheduler.schedule().scheduled == []
    # Two drafts accepted, then the model's own token: 3 tokens.
    outputs = scheduler.update_from_output(plan, StepResult(["a"], [[11, 12, 99]]))
    assert outputs[0].new_token_ids == [11, 12, 99]
    assert request.output_token_ids == [10, 11, 12, 99]
    assert request.num_tokens == 7 and request.num_computed_tokens == 6
    assert manager.num_blocks_of("a") == 2  # the block of rejected drafts only went back
    # A stop token inside the accepted run ends the request there.
    request.sampling_params.stop_token_ids = [13]
    scheduler.proposer = Fixed()
    plan = scheduler.schedule()
    outputs = scheduler.update_from_output(plan, StepResult(["a"], [[11, 13, 14]]))
    assert outputs[0].new_token_ids == [11, 13] and outputs[0].finish_reason == "stop"
    assert manager.num_free_blocks == manager.block_pool.num_usable_blocks
