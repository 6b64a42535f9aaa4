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
    if num_top == 0:
        # The sampled token's alone (`logprobs: 0`, as every token-id stream of `ladle bench
        # serve` asks): no top-k and no joins, three launches fewer a step on the GPU.
        return sampled, sampled_logprobs, ranks
    top_logprobs, top_ids = raw_logprobs.topk(num_top, dim=-1)
    token_ids = torch.cat([sampled, top_ids], dim=1)
    logprobs = torch.cat([sampled_logprobs, top_logprobs], dim=1)
    return token_ids, logprobs, ranks


def pack_logprobs(output: SamplerOutput) -> torch.Tensor:
    """output's logprob tensors as one flat byte tensor (one launch), so that they reach the
    host in one copy instead of three: a copy costs the host a launch and a pinned buffer, and
    at batch 1 the GPU waits for the host (issue 33). The int64 parts (token ids, ranks) come
    first and the float32 logprobs last, so every part starts aligned for unpack_logprobs."""
    assert output.logprob_token_ids is not None and output.logprobs is not None
    assert output.sampled_ranks is not None
    parts = (output.logprob_token_ids, output.sampled_ranks, output.logprobs)
    return torch.cat([part.reshape(-1).view(torch.uint8) for part in parts])


def unpack_logprobs(packed: torch.Tensor, sampled_host: torch.Tensor, width: int) -> SamplerOutput:
    """pack_logprobs' inverse, as views into packed (on the host, once its copy is done):
    width is K+1, the columns of logprob_token_ids and logprobs."""
    num_rows = sampled_host.shape[0]
    ids_end = num_rows * width * 8
    ranks_end = ids_end + num_rows * 8
    return SamplerOutput(
        sampled_token_ids=sampled_host,
        logprob_token_ids=packed[:ids_end].view(torch.int64).view(num_rows, width),
        logprobs=packed[ranks_end:].view(torch.float32).view(num_rows, width),
        sampled_ranks=packed[ids_end:ranks_end].view(torch.int64),
    )


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
