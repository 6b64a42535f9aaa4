"""Made-up steps for memory probing, graph warm-up and calibration, built as the scheduler
builds real plans.

The memory probe runs ModelRunner.execute, the real step path (input packing, forward, logits,
sampler), on a StepPlan of made-up requests whose blocks are all the null block 0. So the probe
measures what a real step allocates, and there is no second hand-written batch builder. The
requests are forgotten by the plan's own finished list the next time one runs (forget_plan).
"""

from __future__ import annotations

from ladle.protocol.step import BlockUpdate, NewRequest, ScheduledRequest, StepPlan
from ladle.sampling.params import MAX_LOGPROBS, SamplingParams

# Every sampling feature at once: the sampler's largest set of logits-sized temporaries.
WORST_CASE_PARAMS = SamplingParams(
    temperature=0.8,
    top_k=50,
    top_p=0.9,
    min_p=0.05,
    repetition_penalty=1.1,
    frequency_penalty=0.5,
    presence_penalty=0.5,
    logprobs=MAX_LOGPROBS,
    max_tokens=1,
)


def prefill_plan(
    prompts: list[list[int]],
    block_ids: list[list[int]],
    params: SamplingParams,
    id_prefix: str,
) -> StepPlan:
    """One step that prefills each prompt whole into the given blocks, each sampling one
    token."""
    plan = StepPlan()
    for index, (prompt, blocks) in enumerate(zip(prompts, block_ids, strict=True)):
        request_id = f"{id_prefix}{index}"
        plan.new_requests.append(
            NewRequest(
                request_id=request_id,
                prompt_token_ids=prompt,
                sampling_params=params,
                sampling_seed=0,
                eos_token_ids=[],
            )
        )
        plan.scheduled.append(
            ScheduledRequest(
                request_id=request_id,
                num_tokens=len(prompt),
                num_computed_before=0,
                output_index=0,
                new_blocks=BlockUpdate(0, blocks),
            )
        )
        plan.num_prefill_tokens += len(prompt)
    return plan


def build_dummy_step(
    num_tokens: int,
    num_reqs: int,
    block_size: int,
    params: SamplingParams = WORST_CASE_PARAMS,
) -> StepPlan:
    """num_tokens fresh prompt tokens split over num_reqs requests, each sampling one token,
    every block the null block (so a one-block cache serves: every write lands in block 0)."""
    num_reqs = max(1, min(num_reqs, num_tokens))
    base, extra = divmod(num_tokens, num_reqs)
    prompts, block_ids = [], []
    for index in range(num_reqs):
        length = base + (1 if index < extra else 0)
        prompts.append([(index + position) % 2 + 1 for position in range(length)])
        block_ids.append([0] * (-(-length // block_size)))
    return prefill_plan(prompts, block_ids, params, "__dummy_")
