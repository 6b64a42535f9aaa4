"""Training the EAGLE-3 head with the training-time test: each batch is unrolled `ttt_steps`
draft steps, step j > 0 feeding the head its own previous pre-norm state, so it learns to chain
as inference will run it.

At step j, position t of a sequence x: the input token is x[t+1+j] (the target's, teacher
forced: a draft the verifier accepts equals it), the rotary position t+j, and the label is the
target's next-token distribution at position t+1+j (restricted to the draft vocabulary), for
answer positions whose target argmax is in the draft vocabulary. Loss: KL divergence from
that distribution (cross-entropy less its entropy), step j weighted 0.8^j (EAGLE-3's choice:
later steps matter less, as their tokens are reached less often).
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ladle.spec_decode.train.eagle3_head import Eagle3Head
from ladle.spec_decode.train.features import SequenceFeatures

STEP_WEIGHT_DECAY = 0.8


@dataclass
class Batch:
    """Padded sequences [B, T]: tokens, fused-layer states, final hidden states, and where a
    label exists (label_mask[b, u]: the target's distribution at u is a training label)."""

    token_ids: torch.Tensor
    aux_hidden: torch.Tensor
    final_hidden: torch.Tensor
    label_mask: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.numel())


def label_mask_of(features: SequenceFeatures, t2d: torch.Tensor) -> torch.Tensor:
    """[T] bool: positions u whose next token is an answer token (u >= prompt_length - 1, and
    not past the last token) and whose target argmax the draft vocabulary holds."""
    length = len(features)
    positions = torch.arange(length, device=features.token_ids.device)
    in_answer = (positions >= features.prompt_length - 1) & (positions <= length - 2)
    return in_answer & t2d.to(features.target_argmax.device)[features.target_argmax]


def make_batch(items: Sequence[SequenceFeatures], t2d: torch.Tensor, device) -> Batch:
    """Pad `items` to the longest (padding carries no label; causal attention keeps it out of
    the real positions' way) and move them to `device`."""
    length = max(len(item) for item in items)

    def pad(tensor: torch.Tensor) -> torch.Tensor:
        extra = length - tensor.shape[0]
        if extra == 0:
            return tensor
        return torch.cat((tensor, tensor.new_zeros((extra, *tensor.shape[1:]))))

    return Batch(
        token_ids=torch.stack([pad(item.token_ids) for item in items]).to(device),
        aux_hidden=torch.stack([pad(item.aux_hidden) for item in items]).to(device),
        final_hidden=torch.stack([pad(item.final_hidden) for item in items]).to(device),
        label_mask=torch.stack([pad(label_mask_of(item, t2d)) for item in items]).to(device),
    )


def shifted(tensor: torch.Tensor, offset: int) -> torch.Tensor:
    """tensor [B, T, ...] moved `offset` positions left along T, zero-padded at the end."""
    if offset == 0:
        return tensor
    tail = tensor.new_zeros((tensor.shape[0], offset, *tensor.shape[2:]))
    return torch.cat((tensor[:, offset:], tail), dim=1)


def unrolled_loss(
    head: Eagle3Head,
    batch: Batch,
    embedding: torch.Tensor,
    target_head_rows: torch.Tensor,
    ttt_steps: int,
) -> tuple[torch.Tensor, list[float]]:
    """(the weighted loss over `ttt_steps` unrolled steps, each step's top-1 accuracy against
    the target's argmax). target_head_rows: the target LM head's rows of the draft vocabulary
    [draft_vocab, hidden]."""
    length = batch.token_ids.shape[1]
    positions = torch.arange(length, device=batch.token_ids.device)
    hidden = head.fuse(batch.aux_hidden)
    chain: list = []
    total = hidden.new_zeros((), dtype=torch.float32)
    accuracies = []
    for step in range(ttt_steps):
        tokens = shifted(batch.token_ids, 1 + step)
        logits, hidden = head.step(embedding[tokens], hidden, positions + step, chain)
        mask = shifted(batch.label_mask, 1 + step)
        with torch.no_grad():
            target_logits = shifted(batch.final_hidden, 1 + step).to(target_head_rows.dtype)
            target_probs = torch.softmax((target_logits @ target_head_rows.t()).float(), dim=-1)
        log_probs = F.log_softmax(logits.float(), dim=-1)
        # KL(target || head): cross-entropy less the target's entropy (the same gradient), so
        # the loss reads as the gap left, 0 when the head matches the target.
        per_token = (torch.xlogy(target_probs, target_probs) - target_probs * log_probs).sum(-1)
        count = mask.sum().clamp(min=1)
        total = total + STEP_WEIGHT_DECAY**step * (per_token * mask).sum() / count
        with torch.no_grad():
            hits = (logits.argmax(-1) == target_probs.argmax(-1)) & mask
            accuracies.append(float(hits.sum() / count))
    return total, accuracies


@dataclass
class StepResult:
    loss: float
    accuracies: list[float]


def train_step(
    head: Eagle3Head,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    embedding: torch.Tensor,
    target_head_rows: torch.Tensor,
    ttt_steps: int,
    max_grad_norm: float = 0.5,
) -> StepResult:
    """One optimizer step on `batch` (in bfloat16 autocast on CUDA, float32 elsewhere); the
    step `ladle train-draft` runs and scripts/train_draft_gpu.py times."""
    head.train()
    optimizer.zero_grad(set_to_none=True)
    device_type = batch.token_ids.device.type
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device_type == "cuda"
        else contextlib.nullcontext()
    )
    with autocast:
        loss, accuracies = unrolled_loss(head, batch, embedding, target_head_rows, ttt_steps)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), max_grad_norm)
    optimizer.step()
    return StepResult(float(loss.detach()), accuracies)


def make_optimizer(head: Eagle3Head, lr: float) -> torch.optim.Optimizer:
    """AdamW over the head's trainable weights (the buffers d2t and t2d are not parameters)."""
    return torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)


def cosine_with_warmup(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_fraction: float = 0.05
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over the first steps, then cosine decay to a tenth of the peak."""
    warmup = max(1, int(total_steps * warmup_fraction))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def batches_by_length(
    items: Sequence[SequenceFeatures], batch_size: int, rng: random.Random
) -> list[list[SequenceFeatures]]:
    """Shuffled batches of similar lengths (less padding): sort a shuffle by length, cut, then
    shuffle the batches."""
    order = list(items)
    rng.shuffle(order)
    order.sort(key=len)
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def train_head(
    head: Eagle3Head,
    features: Sequence[SequenceFeatures],
    embedding: torch.Tensor,
    target_lm_head: torch.Tensor,
    epochs: int,
    lr: float,
    batch_size: int,
    ttt_steps: int,
    seed: int,
    on_step: Callable[[int, int, StepResult], None] | None = None,
) -> list[StepResult]:
    """Train `head` in place over `features` for `epochs`; on_step(step, total, result) after
    each optimizer step (progress). Returns every step's result."""
    if not features:
        raise ValueError("train-draft has no training sequences (every prompt was dropped?)")
    device = embedding.device
    head.to(device)
    rows = target_lm_head[head.draft_token_ids.to(device)]
    rng = random.Random(seed)
    steps_per_epoch = math.ceil(len(features) / batch_size)
    total_steps = epochs * steps_per_epoch
    optimizer = make_optimizer(head, lr)
    scheduler = cosine_with_warmup(optimizer, total_steps)
    results = []
    for _ in range(epochs):
        for items in batches_by_length(features, batch_size, rng):
            batch = make_batch(items, head.t2d, device)
            result = train_step(head, optimizer, batch, embedding, rows, ttt_steps)
            scheduler.step()
            results.append(result)
            if on_step is not None:
                on_step(len(results), total_steps, result)
    return results
