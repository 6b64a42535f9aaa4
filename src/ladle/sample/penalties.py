"""min_tokens bans and the repetition / presence / frequency penalties, batched over requests.

Token ids arrive as [num_reqs, width] tensors padded with vocab_size: they are scattered into a
[num_reqs, vocab_size + 1] buffer whose last column soaks up the padding and is then dropped, so
ragged lists never need a Python loop or a mask of their own.
"""

from __future__ import annotations

import torch


def token_presence(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool [num_reqs, vocab_size]: True where a row's token ids hold the token."""
    present = torch.zeros(
        token_ids.shape[0], vocab_size + 1, dtype=torch.bool, device=token_ids.device
    )
    present.scatter_(1, token_ids.long(), True)
    return present[:, :vocab_size]


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Float32 [num_reqs, vocab_size]: how often each token occurs in a row's token ids.

    Float because the counts only ever scale a penalty; sums of ones are exact, so the atomic
    adds of a device scatter_add_ give the same counts in any order.
    """
    counts = torch.zeros(
        token_ids.shape[0], vocab_size + 1, dtype=torch.float32, device=token_ids.device
    )
    ids = token_ids.long()
    counts.scatter_add_(1, ids, torch.ones(ids.shape, dtype=torch.float32, device=ids.device))
    return counts[:, :vocab_size]


def apply_bans_(logits: torch.Tensor, banned_token_ids: torch.Tensor) -> torch.Tensor:
    """Set the banned tokens' logits to -inf, in place (min_tokens: stop ids not yet allowed)."""
    return logits.masked_fill_(token_presence(banned_token_ids, logits.shape[-1]), float("-inf"))


def apply_penalties_(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor,
    output_token_ids: torch.Tensor,
    presence_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    repetition_penalty: torch.Tensor,
) -> torch.Tensor:
    """Apply the three penalties in place, with vLLM / OpenAI semantics.

    repetition: a token seen in the prompt or the output has a positive logit divided by the
    penalty and a negative one multiplied by it (both move it down for a penalty > 1).
    frequency: subtract penalty * (times the token occurs in the output).
    presence: subtract penalty once if the token occurs in the output.
    A row with neutral values (1, 0, 0) comes out bit-identical.
    """
    vocab_size = logits.shape[-1]
    output_counts = token_counts(output_token_ids, vocab_size)
    output_present = output_counts > 0
    seen = token_presence(prompt_token_ids, vocab_size) | output_present

    repetition = repetition_penalty.to(logits.dtype)[:, None]
    repeated = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits.copy_(torch.where(seen, repeated, logits))

    logits.sub_(frequency_penalty.to(logits.dtype)[:, None] * output_counts)
    logits.sub_(presence_penalty.to(logits.dtype)[:, None] * output_present)
    return logits
