"""Dummy steps for memory probing, built as the scheduler builds real ones.

The memory probe runs ModelRunner.execute, the real step path (input packing, forward, logits,
sampler), on a SchedulerOutput of made-up requests whose blocks are all the null block 0. So the
probe measures what a real step allocates, and there is no second hand-written batch builder.
"""

from __future__ import annotations

from ladle.core.request import Request
from ladle.core.scheduler import SchedulerOutput
from ladle.sampling_params import MAX_LOGPROBS, SamplingParams

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


def build_dummy_step(
    num_tokens: int,
    num_reqs: int,
    block_size: int,
    params: SamplingParams = WORST_CASE_PARAMS,
) -> tuple[SchedulerOutput, list[list[int]]]:
    """num_tokens fresh prompt tokens split over num_reqs requests, each sampling one token.

    Returns the step and each request's block ids (all the null block, so a one-block cache
    serves: every write lands in block 0)."""
    num_reqs = max(1, min(num_reqs, num_tokens))
    base, extra = divmod(num_tokens, num_reqs)
    output = SchedulerOutput()
    block_ids = []
    for index in range(num_reqs):
        length = base + (1 if index < extra else 0)
        request = Request(
            request_id=f"__dummy_{index}",
            prompt_token_ids=[(index + position) % 2 + 1 for position in range(length)],
            sampling_params=params,
        )
        output.add(request, length)
        output.num_computed_before[request.request_id] = 0
        output.output_index[request.request_id] = 0
        block_ids.append([0] * (-(-length // block_size)))
    return output, block_ids
