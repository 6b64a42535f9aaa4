"""Small factories for core tests: Requests from token ids, and a simulated engine step."""

from __future__ import annotations

from ladle.core.kv_cache_manager import KVCacheManager
from ladle.core.request import Request
from ladle.protocol.step import StepPlan, StepResult
from ladle.sampling.params import SamplingParams


def make_request(
    request_id: str,
    prompt_token_ids: list[int],
    *,
    max_tokens: int = 16,
    cache_salt: str | None = None,
) -> Request:
    """A waiting Request with the given prompt and default sampling."""
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt_token_ids),
        sampling_params=SamplingParams(max_tokens=max_tokens),
        cache_salt=cache_salt,
    )


def schedule_prefill(manager: KVCacheManager, request: Request) -> int:
    """Look up prefix hits, allocate the whole prompt, and compute it, as one scheduler step would.

    Returns the number of prompt tokens that hit the prefix cache. Fails the test if the pool is
    too small.
    """
    hit_blocks, num_hit_tokens = manager.get_computed_blocks(request)
    num_new_tokens = request.num_tokens - num_hit_tokens
    allocated = manager.allocate_slots(request, num_new_tokens, hit_blocks, num_hit_tokens)
    assert allocated is not None, f"no room for {request.request_id}"
    request.num_computed_tokens = request.num_tokens
    manager.cache_computed_blocks(request)
    return num_hit_tokens


def decode_step(manager: KVCacheManager, request: Request, token_id: int) -> bool:
    """Sample token_id, allocate its slot and compute it, as one decode step would.

    In the engine the sampled token's KV is written by the next step; here both happen at once.
    Returns False (and changes nothing) when the pool has no room.
    """
    if manager.allocate_slots(request, 1) is None:
        return False
    request.append_output_token(token_id)
    request.num_computed_tokens += 1
    manager.cache_computed_blocks(request)
    return True


def one_token_each(plan: StepPlan, token_ids: list[int]) -> StepResult:
    """A StepResult giving token_ids[i] to the plan's i-th request if it samples (and nothing
    to a prompt chunk short of its prompt's end), as a one-token step's workers would."""
    return StepResult(
        request_ids=plan.request_ids(),
        token_ids=[
            [token] if scheduled.samples else []
            for scheduled, token in zip(plan.scheduled, token_ids, strict=True)
        ],
    )


def granted(plan: StepPlan) -> dict[str, int]:
    """request id -> tokens the plan grants it."""
    return {scheduled.request_id: scheduled.num_tokens for scheduled in plan.scheduled}


def output_indices(plan: StepPlan) -> dict[str, int]:
    """request id -> the output index its sample takes, for the requests that sample."""
    return {s.request_id: s.output_index for s in plan.scheduled if s.samples}


def computed_before(plan: StepPlan) -> dict[str, int]:
    return {s.request_id: s.num_computed_before for s in plan.scheduled}
