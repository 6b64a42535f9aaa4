"""Training the EAGLE-3 head with the training-time test: each batch is unrolled `ttt_steps`
draft steps, step j > 0 feeding the head its own previous pre-norm state, so it learns to chain
as inference will run it.

At step j, position t of a sequence x: the input token is x[t+1+j] (the target's, teacher
forced: a draft the verifier accepts equals it), the rotary position t+j, and the label is the
target's next-token distribution at position t+1+j (restricted to the draft vocabulary), for
positions whose target argmax is in the draft vocabulary: the answer's, and with label_prompts
the prompt's too (the target's distribution there is as much its own as on its answers).
Loss: KL divergence from that distribution (cross-entropy less its entropy), step j weighted
0.8^j (EAGLE-3's choice: later steps matter less, as their tokens are reached less often).
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


def label_mask_of(
    features: SequenceFeatures, t2d: torch.Tensor, label_prompts: bool = False
) -> torch.Tensor:
    """[T] bool: positions u whose next token is an answer token (u >= prompt_length - 1; any
    u with label_prompts), not past the last token, and whose target argmax the draft
    vocabulary holds."""
    length = len(features)
    positions = torch.arange(length, device=features.token_ids.device)
    first = 0 if label_prompts else features.prompt_length - 1
    in_range = (positions >= first) & (positions <= length - 2)
    return in_range & t2d.to(features.target_argmax.device)[features.target_argmax]


def make_batch(
    items: Sequence[SequenceFeatures], t2d: torch.Tensor, device, label_prompts: bool = False
) -> Batch:
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
        label_mask=torch.stack([pad(label_mask_of(item, t2d, label_prompts)) for item in items]).to(
            device
        ),
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
    # The labels once for all steps (step j's are these shifted), outside any autocast: the
    # target's distribution in float32, as the model that serves computes it.
    with torch.no_grad(), torch.autocast(batch.token_ids.device.type, enabled=False):
        target_logits = batch.final_hidden.to(target_head_rows.dtype) @ target_head_rows.t()
        all_target_probs = torch.softmax(target_logits.float(), dim=-1)
        all_neg_entropy = torch.xlogy(all_target_probs, all_target_probs).sum(-1)
    hidden = head.fuse(batch.aux_hidden)
    chain: list = []
    total = hidden.new_zeros((), dtype=torch.float32)
    accuracies = []
    for step in range(ttt_steps):
        tokens = shifted(batch.token_ids, 1 + step)
        logits, hidden = head.step(embedding[tokens], hidden, positions + step, chain)
        mask = shifted(batch.label_mask, 1 + step)
        target_probs = shifted(all_target_probs, 1 + step)
        log_probs = F.log_softmax(logits.float(), dim=-1)
        # KL(target || head): cross-entropy less the target's entropy (the same gradient), so
        # the loss reads as the gap left, 0 when the head matches the target.
        per_token = shifted(all_neg_entropy, 1 + step) - (target_probs * log_probs).sum(-1)
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
    # The batch's sequence tokens, padding excluded (the training curve's x axis).
    num_tokens: int = 0


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    """The step's autocast: `dtype` on `device` (None: bfloat16 on CUDA, float32 elsewhere;
    float32: none). bfloat16 on a CPU with AVX-512 BF16 ran the default model's head step 1.8x
    faster than float32 (1.4 s against 2.5 s, 4 x 256 tokens, 4 unrolled steps, one thread)."""
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def train_step(
    head: Eagle3Head,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    embedding: torch.Tensor,
    target_head_rows: torch.Tensor,
    ttt_steps: int,
    max_grad_norm: float = 0.5,
    autocast_dtype: torch.dtype | None = None,
) -> StepResult:
    """One optimizer step on `batch` (under autocast_context(autocast_dtype)); the step
    `ladle train-draft` runs and scripts/train_draft_gpu.py times."""
    head.train()
    optimizer.zero_grad(set_to_none=True)
    with autocast_context(batch.token_ids.device, autocast_dtype):
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
    label_prompts: bool = False,
    autocast_dtype: torch.dtype | None = None,
) -> list[StepResult]:
    """Train `head` in place over `features` for `epochs`; on_step(step, total, result) after
    each optimizer step (progress, held-out checks). Returns every step's result."""
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
            batch = make_batch(items, head.t2d, device, label_prompts)
            result = train_step(
                head, optimizer, batch, embedding, rows, ttt_steps, autocast_dtype=autocast_dtype
            )
            result.num_tokens = sum(len(item) for item in items)
            scheduler.step()
            results.append(result)
            if on_step is not None:
                on_step(len(results), total_steps, result)
    return results
