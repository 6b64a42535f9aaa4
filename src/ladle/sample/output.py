"""SamplerOutput: what one sampler call returns, still on the logits' device."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplerOutput:
    """Sampled ids and, when some request asked, logprobs of the raw (unprocessed) distribution.

    logprob_token_ids / logprobs are [num_reqs, K+1]: column 0 the sampled token, columns 1..K
    the top K (K = the batch's largest requested logprobs). sampled_ranks is 1 + the number of
    tokens with a strictly larger logprob than the sampled one.
    """

    sampled_token_ids: torch.Tensor  # int64 [num_reqs]
    logprob_token_ids: torch.Tensor | None = None  # int64 [num_reqs, K+1]
    logprobs: torch.Tensor | None = None  # float32 [num_reqs, K+1]
    sampled_ranks: torch.Tensor | None = None  # int64 [num_reqs]
