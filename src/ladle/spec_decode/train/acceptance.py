"""Offline acceptance of an EAGLE-3 head on held-out (prompt, target answer) sequences, drafted
exactly as inference drafts: at a position t whose next token x[t+1] the target has just given,
step 0 reads embed(x[t+1]) and the target's fused features at t, each later step the previous
draft token and the head's own pre-norm state, k steps in all, greedily.

Greedy verification accepts the drafts up to the first that differs from the target's own
continuation, then the target adds one token (the bonus), so one target step yields
accepted + 1 tokens. The walk follows the decode: it starts at the prompt's last position and
moves on by accepted + 1. Acceptance length = mean tokens per target step = 1 + mean accepted
(vLLM's `mean acceptance length`, bonus token included).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ladle.spec_decode.train.eagle3_head import Eagle3Head
from ladle.spec_decode.train.features import SequenceFeatures
from ladle.spec_decode.train.trainer import shifted

# features -> draft target ids [T, k]: row t holds the k tokens drafted after position t + 1.
Drafter = Callable[[SequenceFeatures, int], torch.Tensor]


@dataclass
class AcceptanceResult:
    """acceptance_length: mean tokens per target step (1 + mean accepted), over the decode walk;
    position_acceptance[i]: the fraction of walk steps whose draft i+1 was accepted;
    num_steps: target steps measured; num_sequences: sequences that had any."""

    acceptance_length: float
    position_acceptance: list[float]
    num_steps: int
    num_sequences: int
    k: int

    def as_dict(self) -> dict:
        return {
            "acceptance_length": round(self.acceptance_length, 4),
            "position_acceptance": [round(value, 4) for value in self.position_acceptance],
            "num_target_steps": self.num_steps,
            "num_sequences": self.num_sequences,
            "num_speculative_tokens": self.k,
            "definition": "tokens per target step incl. the bonus token (vLLM's)",
        }


def head_drafter(head: Eagle3Head, embedding: torch.Tensor) -> Drafter:
    """Greedy chain drafting with `head` over every position of a sequence at once."""

    @torch.no_grad()
    def draft(features: SequenceFeatures, k: int) -> torch.Tensor:
        head.eval()
        device = embedding.device
        tokens = features.token_ids.to(device)[None]
        length = tokens.shape[1]
        positions = torch.arange(length, device=device)
        hidden = head.fuse(features.aux_hidden.to(device)[None])
        draft_ids = head.draft_token_ids.to(device)
        inputs = shifted(tokens, 1)
        chain: list = []
        drafts = []
        for step in range(k):
            logits, hidden = head.step(embedding[inputs], hidden, positions + step, chain)
            inputs = draft_ids[logits.argmax(dim=-1)]
            drafts.append(inputs[0])
        return torch.stack(drafts, dim=-1)

    return draft


def accepted_counts(
    drafts: torch.Tensor, token_ids: torch.Tensor, prompt_length: int, k: int
) -> list[int]:
    """Accepted drafts at each target step of the decode walk over one sequence: drafts [T, k]
    (row t: the tokens drafted for positions t+2 .. t+k+1), token_ids [T] the target's."""
    length = int(token_ids.shape[0])
    drafts, token_ids = drafts.cpu(), token_ids.cpu()
    counts = []
    position = prompt_length - 1
    # A step is measured only where the target's continuation covers all k drafts.
    while position + 1 + k <= length - 1:
        expected = token_ids[position + 2 : position + 2 + k]
        matches = (drafts[position] == expected).to(torch.int64)
        accepted = int(matches.cumprod(0).sum())
        counts.append(accepted)
        position += accepted + 1
    return counts


def measure_acceptance(
    drafter: Drafter, sequences: Sequence[SequenceFeatures], k: int = 4
) -> AcceptanceResult:
    """Acceptance of `drafter` at k drafts per step over `sequences` (see the module doc)."""
    if k < 1:
        raise ValueError(f"num_speculative_tokens {k} must be >= 1")
    all_counts: list[int] = []
    measured = 0
    for features in sequences:
        counts = accepted_counts(
            drafter(features, k), features.token_ids, features.prompt_length, k
        )
        all_counts.extend(counts)
        measured += bool(counts)
    if not all_counts:
        return AcceptanceResult(float("nan"), [float("nan")] * k, 0, 0, k)
    counts_tensor = torch.tensor(all_counts)
    position_acceptance = [float((counts_tensor > index).float().mean()) for index in range(k)]
    return AcceptanceResult(
        1.0 + float(counts_tensor.float().mean()), position_acceptance, len(all_counts), measured, k
    )
