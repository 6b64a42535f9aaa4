"""Prompt logprobs (vLLM's SamplingParams.prompt_logprobs): the logprob of every prompt token
given the tokens before it, with its rank and the top k candidates.

They come from the prefill's own hidden states: the row of prompt position p predicts token
p + 1. A prompt prefilled in chunks gives its logprobs chunk by chunk. Tokens served from the
prefix cache have no hidden states, so such requests skip the cache (kv_cache_manager.py) and
compute every position, as vLLM does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ladle.protocol.messages import TokenLogprobs
from ladle.protocol.step import PromptLogprobsChunk, StepPlan
from ladle.sample.logprobs import gather_logprobs
from ladle.worker.request_states import RequestStates

# Rows turned into full-vocabulary logprobs at once: bounds the step's extra memory
# (rows x vocabulary x 4 bytes) on long prompts.
ROWS_PER_SLICE = 256


def compute_prompt_logprobs(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    plan: StepPlan,
    states: RequestStates,
) -> dict[str, PromptLogprobsChunk] | None:
    """This step's prompt logprobs of the requests that asked for them (None: none did).

    hidden: the step's hidden states, one row per scheduled token, requests in scheduling order.
    Each request's chunk starts where the plan says its new tokens start.
    """
    chunks: dict[str, PromptLogprobsChunk] = {}
    row_start = 0
    for scheduled in plan.scheduled:
        num_rows = scheduled.num_tokens
        first_row = row_start
        row_start += num_rows
        request = states[scheduled.request_id]
        k = request.sampling_params.prompt_logprobs
        prompt = request.prompt_token_ids
        start = scheduled.num_computed_before
        if k is None or start >= len(prompt) - 1:
            continue
        # Rows of positions start .. end - 1 predict prompt tokens start + 1 .. end.
        end = min(start + num_rows, len(prompt) - 1)
        targets = torch.tensor(prompt[start + 1 : end + 1], dtype=torch.int64)
        entries: list[TokenLogprobs] = []
        for offset in range(0, end - start, ROWS_PER_SLICE):
            rows = slice(first_row + offset, first_row + min(offset + ROWS_PER_SLICE, end - start))
            logits = compute_logits(hidden[rows]).float()
            raw = torch.log_softmax(logits, dim=-1)
            slice_targets = targets[offset : offset + raw.shape[0]].to(raw.device)
            token_ids, logprobs, ranks = gather_logprobs(raw, slice_targets, k)
            entries += _to_messages(token_ids.tolist(), logprobs.tolist(), ranks.tolist())
        chunks[request.request_id] = PromptLogprobsChunk(len(prompt), start + 1, entries)
    return chunks or None


def _to_messages(
    token_ids: list[list[int]], logprobs: list[list[float]], ranks: list[int]
) -> list[TokenLogprobs]:
    return [
        TokenLogprobs(
            token_id=ids[0],
            logprob=values[0],
            rank=rank,
            top_token_ids=ids[1:],
            top_logprobs=values[1:],
        )
        for ids, values, rank in zip(token_ids, logprobs, ranks, strict=True)
    ]
