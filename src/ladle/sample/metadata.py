"""What the sampler needs to know about a batch: per-request rows, host-side flags, token ids.

The rows are [num_reqs] tensors of float32 or int32 only. Both are 4 bytes wide, so the model
runner can pack every row into one pinned int32 buffer, ship it with a single host-to-device copy
and view the float rows back with `.view(torch.float32)`; ROW_DTYPES fixes their names and order.

The flags are computed on the host while the batch is built, so the sampler skips every step no
request in the batch needs (a sort for top-k/top-p, a scatter for penalties) without ever reading
a device tensor back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from ladle.sample.logit_processing import LogitEdits, build_logit_edits
from ladle.sampling.params import SamplingParams

# Row name -> dtype, in packing order.
ROW_DTYPES: dict[str, torch.dtype] = {
    "temperature": torch.float32,
    "top_k": torch.int32,  # 0 = off
    "top_p": torch.float32,
    "min_p": torch.float32,
    "presence_penalty": torch.float32,
    "frequency_penalty": torch.float32,
    "repetition_penalty": torch.float32,
    "seed": torch.int32,  # low 31 bits of the request's sampling seed
    "step": torch.int32,  # tokens generated so far: the counter of the request's random stream
}

_SEED_MASK = 0x7FFFFFFF


def build_sampling_rows(
    params: list[SamplingParams], seeds: list[int], num_output_tokens: list[int]
) -> dict[str, torch.Tensor]:
    """Host row tensors, one entry per request, keyed and typed as in ROW_DTYPES.

    seeds are the requests' sampling seeds (any int; the low 31 bits are kept) and
    num_output_tokens how many tokens each has generated so far (the random stream's step).
    """
    if not len(params) == len(seeds) == len(num_output_tokens):
        raise ValueError(
            f"params, seeds and num_output_tokens differ in length: "
            f"{len(params)}, {len(seeds)}, {len(num_output_tokens)}"
        )
    values: dict[str, list] = {
        "temperature": [p.temperature for p in params],
        "top_k": [max(p.top_k, 0) for p in params],
        "top_p": [p.top_p for p in params],
        "min_p": [p.min_p for p in params],
        "presence_penalty": [p.presence_penalty for p in params],
        "frequency_penalty": [p.frequency_penalty for p in params],
        "repetition_penalty": [p.repetition_penalty for p in params],
        "seed": [seed & _SEED_MASK for seed in seeds],
        "step": list(num_output_tokens),
    }
    return {name: torch.tensor(values[name], dtype=dtype) for name, dtype in ROW_DTYPES.items()}


def pack_sampling_rows(
    params: list[SamplingParams], seeds: list[int], num_output_tokens: list[int]
) -> torch.Tensor:
    """The rows of build_sampling_rows as one int32 [num_reqs, len(ROW_DTYPES)] host tensor,
    float values stored bit for bit (the persistent batch keeps one such row per slot)."""
    rows = build_sampling_rows(params, seeds, num_output_tokens)
    return torch.stack([rows[name].view(torch.int32) for name in ROW_DTYPES], dim=1)


def unpack_sampling_rows(packed: torch.Tensor) -> dict[str, torch.Tensor]:
    """pack_sampling_rows' inverse: contiguous [num_reqs] rows, on packed's device."""
    return unpack_sampling_columns(packed.t().contiguous())


def unpack_sampling_columns(columns: torch.Tensor) -> dict[str, torch.Tensor]:
    """[len(ROW_DTYPES), num_reqs] contiguous int32 -> the [num_reqs] rows, as views (no
    launch: the persistent batch's gather gives this layout)."""
    return {
        name: columns[index].view(dtype) for index, (name, dtype) in enumerate(ROW_DTYPES.items())
    }


@dataclass(frozen=True)
class SamplingFlags:
    """Host-side facts about a batch that let the sampler skip work no request needs.

    The truncation flags look at random (non-greedy) requests only: a greedy row takes the argmax
    whatever its top-k, top-p or min-p. Penalties change greedy rows too, so every row counts there.
    """

    all_greedy: bool
    all_random: bool
    no_top_k: bool
    no_top_p: bool
    no_min_p: bool
    no_penalties: bool
    max_num_logprobs: int | None  # None: no request asked for logprobs
    # Largest top_k of the random rows that set one (0: none): top-k alone then needs a top-k
    # selection of this width instead of a sort of the whole vocabulary.
    max_top_k: int = 0
    # No row has min_tokens (so none bans its stop ids), nor logit_bias, allowed_token_ids or
    # bad_words (so the batch has no LogitEdits): building either is then skipped per step.
    # False: not known, build them (their builders return None when nothing applies).
    no_min_tokens: bool = False
    no_logit_edits: bool = False

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams]) -> SamplingFlags:
        random_params = [p for p in params if not p.is_greedy]
        requested_logprobs = [p.logprobs for p in params if p.logprobs is not None]
        return cls(
            all_greedy=not random_params,
            all_random=len(random_params) == len(params),
            no_top_k=all(p.top_k <= 0 for p in random_params),
            no_top_p=all(p.top_p >= 1.0 for p in random_params),
            no_min_p=all(p.min_p <= 0.0 for p in random_params),
            no_penalties=not any(p.uses_penalties for p in params),
            max_num_logprobs=max(requested_logprobs) if requested_logprobs else None,
            max_top_k=max((p.top_k for p in random_params if p.top_k > 0), default=0),
            no_min_tokens=all(p.min_tokens <= 0 for p in params),
            no_logit_edits=not any(
                p.logit_bias or p.allowed_token_ids or p.bad_words_token_ids for p in params
            ),
        )


@dataclass
class SamplingMetadata:
    """Everything the Sampler reads for one batch: row tensors on the logits' device, flags on
    the host, and the padded token-id tensors penalties and min_tokens need (None when unused).

    Token-id tensors are [num_reqs, width] ints padded with vocab_size, which the sampler scatters
    into a spare column and drops.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    presence_penalty: torch.Tensor
    frequency_penalty: torch.Tensor
    repetition_penalty: torch.Tensor
    seed: torch.Tensor
    step: torch.Tensor
    flags: SamplingFlags
    prompt_token_ids: torch.Tensor | None = None  # penalties only
    output_token_ids: torch.Tensor | None = None  # penalties only
    banned_token_ids: torch.Tensor | None = None  # stop ids of requests short of min_tokens
    logit_edits: LogitEdits | None = None  # logit_bias / allowed_token_ids (logit_processing.py)
    # Speculative rows whose drafts came with a distribution (a draft model): each row's draft id
    # (-1 for a bonus row) and the draft's probabilities [num_reqs, vocab]. None for point-mass
    # drafts, which the plain draw verifies (sample/rejection.py).
    draft_token_ids: torch.Tensor | None = None
    draft_probs: torch.Tensor | None = None

    @classmethod
    def from_rows(
        cls,
        rows: dict[str, torch.Tensor],
        flags: SamplingFlags,
        *,
        prompt_token_ids: torch.Tensor | None = None,
        output_token_ids: torch.Tensor | None = None,
        banned_token_ids: torch.Tensor | None = None,
        logit_edits: LogitEdits | None = None,
    ) -> SamplingMetadata:
        """Wrap row tensors (host or device, e.g. views into the runner's packed buffer)."""
        missing = set(ROW_DTYPES) - set(rows)
        if missing:
            raise ValueError(f"sampling rows missing: {sorted(missing)}")
        if not flags.no_penalties and (prompt_token_ids is None or output_token_ids is None):
            raise ValueError("penalties need prompt_token_ids and output_token_ids")
        return cls(
            **{name: rows[name] for name in ROW_DTYPES},
            flags=flags,
            prompt_token_ids=prompt_token_ids,
            output_token_ids=output_token_ids,
            banned_token_ids=banned_token_ids,
            logit_edits=logit_edits,
        )

    @property
    def num_reqs(self) -> int:
        return self.temperature.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SamplingMetadata:
        """A copy with every tensor on device (for tests and simple callers; the runner packs)."""
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (torch.Tensor, LogitEdits)):
                value = value.to(device, non_blocking=non_blocking)
            moved[f.name] = value
        return SamplingMetadata(**moved)


def pad_token_ids(token_ids: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """Host int64 [len(token_ids), max(1, longest)] tensor, short rows filled with pad_id."""
    width = max((len(ids) for ids in token_ids), default=0)
    padded = torch.full((len(token_ids), max(width, 1)), pad_id, dtype=torch.int64)
    for row, ids in enumerate(token_ids):
        if ids:
            padded[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.int64)
    return padded


def build_penalty_token_ids(
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt, output) padded host tensors for the repetition/presence/frequency penalties."""
    return pad_token_ids(prompt_token_ids, vocab_size), pad_token_ids(output_token_ids, vocab_size)


def build_banned_token_ids(
    params: Sequence[SamplingParams],
    num_output_tokens: Sequence[int],
    eos_token_ids: Sequence[Sequence[int]],
    vocab_size: int,
) -> torch.Tensor | None:
    """Padded host tensor of the stop ids each request may not sample yet, or None if none.

    A request short of its min_tokens may sample neither its stop_token_ids nor (unless
    ignore_eos) its eos ids. Ids outside the vocabulary cannot be sampled anyway and are dropped.
    """
    banned: list[list[int]] = []
    for p, num_output, eos_ids in zip(params, num_output_tokens, eos_token_ids, strict=True):
        if num_output >= p.min_tokens:
            banned.append([])
            continue
        stop_ids = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_ids))
        banned.append(sorted({t for t in stop_ids if 0 <= t < vocab_size}))
    if not any(banned):
        return None
    return pad_token_ids(banned, vocab_size)


def build_sampling_metadata(
    params: list[SamplingParams],
    seeds: list[int],
    num_output_tokens: list[int],
    *,
    vocab_size: int,
    prompt_token_ids: Sequence[Sequence[int]] | None = None,
    output_token_ids: Sequence[Sequence[int]] | None = None,
    eos_token_ids: Sequence[Sequence[int]] | None = None,
    device: torch.device | str = "cpu",
    rows: dict[str, torch.Tensor] | None = None,
    penalty_token_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
    flags: SamplingFlags | None = None,
) -> SamplingMetadata:
    """Build a batch's metadata from lists in one call.

    Token ids are only read when some request needs them: prompt and output ids for penalties,
    eos ids (default none) for min_tokens; those tensors then take their own copy to the device.
    rows: the row tensors, on device, when the caller already shipped them (the model runner
    packs them into its one host-to-device copy); built from params, seeds and
    num_output_tokens if None.
    penalty_token_ids: the padded (prompt, output) ids when the caller keeps them on the device
    (the model runner's PenaltyHistory); built from the host lists if None.
    flags: SamplingFlags.from_params(params) when the caller computed them already.
    """
    if flags is None:
        flags = SamplingFlags.from_params(params)
    penalty_ids: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
    if not flags.no_penalties and penalty_token_ids is not None:
        penalty_ids = penalty_token_ids
    elif not flags.no_penalties:
        if prompt_token_ids is None or output_token_ids is None:
            raise ValueError("penalties need prompt_token_ids and output_token_ids")
        penalty_ids = build_penalty_token_ids(prompt_token_ids, output_token_ids, vocab_size)
    if eos_token_ids is None:
        eos_token_ids = [()] * len(params)
    if rows is None:
        rows = {
            name: row.to(device)
            for name, row in build_sampling_rows(params, seeds, num_output_tokens).items()
        }
    banned = None
    if not flags.no_min_tokens:
        banned = build_banned_token_ids(params, num_output_tokens, eos_token_ids, vocab_size)
    edits = None
    if not flags.no_logit_edits:
        edits = build_logit_edits(params, vocab_size, output_token_ids)
    # Only what was built here on the host moves: the runner's rows (and penalty ids) are on
    # the device already, and a move of the whole metadata costs a batch-1 step ~40 us.
    return SamplingMetadata.from_rows(
        rows,
        flags,
        prompt_token_ids=_to_device(penalty_ids[0], device),
        output_token_ids=_to_device(penalty_ids[1], device),
        banned_token_ids=_to_device(banned, device),
        logit_edits=_to_device(edits, device),
    )


def _to_device(value, device: torch.device | str):
    """A host-built tensor (or LogitEdits) on device; None stays None."""
    return None if value is None else value.to(device)
