"""Logprobs of the raw distribution: the sampled token's, its rank, and the top-K candidates."""

from __future__ import annotations

import torch

from ladle.protocol.messages import TokenLogprobs
from ladle.sample.output import SamplerOutput


def gather_logprobs(
    raw_logprobs: torch.Tensor, sampled_token_ids: torch.Tensor, num_logprobs: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token ids [num_reqs, K+1], logprobs [num_reqs, K+1], ranks [num_reqs]) on the device.

    Column 0 is the sampled token, columns 1..K the top K of raw_logprobs (K is capped at the
    vocabulary size). The rank is 1 + the number of tokens with a strictly larger logprob, so
    tied tokens share the best rank, as OpenAI reports it.
    """
    sampled = sampled_token_ids.to(torch.int64)[:, None]
    sampled_logprobs = raw_logprobs.gather(1, sampled)
    ranks = (raw_logprobs > sampled_logprobs).sum(dim=-1) + 1
    num_top = min(num_logprobs, raw_logprobs.shape[-1])
    top_logprobs, top_ids = raw_logprobs.topk(num_top, dim=-1)
    token_ids = torch.cat([sampled, top_ids], dim=1)
    logprobs = torch.cat([sampled_logprobs, top_logprobs], dim=1)
    return token_ids, logprobs, ranks


def logprobs_to_messages(
    output: SamplerOutput, num_logprobs_per_req: list[int | None]
) -> list[TokenLogprobs | None]:
    """One TokenLogprobs per request that asked for logprobs (None for the others), its top list
    trimmed to that request's own k. Expects output's tensors on the host already: the caller
    copies them once for the whole batch."""
    if all(k is None for k in num_logprobs_per_req):
        return [None] * len(num_logprobs_per_req)
    if output.logprobs is None or output.logprob_token_ids is None or output.sampled_ranks is None:
        raise ValueError("requests asked for logprobs but the sampler computed none")
    if len(num_logprobs_per_req) != output.logprobs.shape[0]:
        raise ValueError(
            f"{len(num_logprobs_per_req)} requests for {output.logprobs.shape[0]} sampled rows"
        )
    token_ids = output.logprob_token_ids.tolist()
    logprobs = output.logprobs.tolist()
    ranks = output.sampled_ranks.tolist()
    messages: list[TokenLogprobs | None] = []
    for row, k in enumerate(num_logprobs_per_req):
        if k is None:
            messages.append(None)
            continue
        messages.append(
            TokenLogprobs(
                token_id=token_ids[row][0],
                logprob=logprobs[row][0],
                rank=ranks[row],
                top_token_ids=token_ids[row][1 : 1 + k],
                top_logprobs=logprobs[row][1 : 1 + k],
            )
        )
    return messages
