"""Drafted steps that the host plans before the step they follow is read (engine/overlap.py).

The scheduler plans a drafted request's next step while its verify step is in flight, for the
worst case (every draft accepted, core/drafts_in_flight.py). What the host does not know then is
resolved here, on the device, per slot of the persistent batch:

- after each sampling, the verdict: per request how many drafts its rows accepted (a draft is
  accepted while the row before it sampled it; benchmarks' synthetic acceptance draws a coin per
  row on the device instead), the token each row emits, the request's last emitted token (into
  the batch's last_sampled, which the next step reads as its input) and the drafts it rejected
  (`rejected`, by which the next step is moved back);
- the request's tokens (`history`, with `lengths`), appended with each step's emitted tokens,
  from which the next step's n-gram drafts are made (worker/device_ngram.py);
- before a step's forward: the placeholder drafts (-1) are filled in, and a step planned behind
  an unread verify step has its positions, KV slots, sequence lengths and sampling counters moved
  back by what that step rejected.

Every index the device needs is known to the host when it builds the step: those arrays travel
in the step's one host-to-device copy (StepInputBuilder.build's extra_parts), so the device work
is ~75 small launches a drafted step (the n-gram ~30) and no extra copy, or three with the
fused kernels (kernels/draft_steps.py, LADLE_DRAFT_KERNELS=1). The host reads the
verdict with the sampled ids (one tensor, one copy: Verdict.words); it never waits for it
earlier. The history costs slots x (max_n + max_model_len + 32) int32 on the device,
allocated as the batch's slots grow.
On the CPU the corrected sequence lengths are read back at once (the CPU attention reads host
lengths, and there a read costs nothing); on CUDA the host keeps the upper bounds, which the
Triton attention reads only as bounds.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np
import torch

from ladle.kernels.dispatch import fused_kernels_enabled
from ladle.protocol.step import StepPlan
from ladle.worker.device_ngram import ngram_drafts
from ladle.worker.persistent_batch import PersistentBatch
from ladle.worker.request_states import RequestStates
from ladle.worker.step_inputs import ExtraParts, StepInputs, remember_bounded

# The fused kernels run on CUDA with the fused kernels on (kernels/dispatch.py), where they
# measured faster than the torch path (8B shape, batch 1: 1.58 against 1.63 ms/token);
# LADLE_DRAFT_KERNELS=0 takes the torch path.
DRAFT_KERNELS_ENV = "LADLE_DRAFT_KERNELS"


def draft_kernels_enabled(device: torch.device) -> bool:
    """Whether DeviceDrafts takes kernels/draft_steps.py's launches on this device."""
    return (
        device.type == "cuda"
        and fused_kernels_enabled()
        and os.environ.get(DRAFT_KERNELS_ENV, "1") != "0"
    )


# Draft positions past this are never made (config.MAX_SPECULATIVE_TOKENS is lower): the
# history's rows leave room for a step's emitted tokens past the model length.
_MAX_DRAFTS = 32


@dataclass
class Verdict:
    """A sampled step's verdict, on the device until the step is read."""

    row_tokens: torch.Tensor  # [rows] int64: each row's emitted token (its draft if accepted)
    num_accepted: torch.Tensor | None  # [sampling requests] int64; None: no drafts (all 0)
    first_rows: list[int]  # [sampling requests]: each one's first sampling row
    positions: list[int]  # [sampling requests]: each one's place in the plan
    # row_tokens then num_accepted, one tensor (the two are views of it): the host reads the
    # verdict with one copy (and one pinned buffer), not two. None: row_tokens alone.
    words: torch.Tensor | None = None

    def emitted(
        self, num_scheduled: int, row_tokens: list[int], accepted: list[int]
    ) -> list[list[int]]:
        """Per scheduled request, the tokens it emits (from host copies of the tensors;
        accepted: empty when the step verified no drafts)."""
        if not accepted:
            accepted = [0] * len(self.first_rows)
        emitted: list[list[int]] = [[] for _ in range(num_scheduled)]
        for position, first, count in zip(self.positions, self.first_rows, accepted):
            emitted[position] = row_tokens[first : first + count + 1]
        return emitted


@dataclass
class StepShape:
    """What the host knows of one step's drafts (DeviceDrafts.shape): its layout alone, so a
    shape is shared by the steps of that layout (read only)."""

    num_drafts: np.ndarray  # [scheduled] drafts each verifies
    drafting: np.ndarray  # plan positions whose drafts are made on the device
    shifted: np.ndarray  # [scheduled] 1 where the step is planned behind an unread verify step
    row_positions: np.ndarray  # [rows] plan position of each sampling row
    row_offsets: np.ndarray  # [rows] drafts before the row
    first_rows: np.ndarray  # [sampling requests]
    max_drafts: int  # over the sampling requests
    # The same facts as host values, read per step (a numpy call each would cost more).
    any_shifted: bool
    max_device_drafts: int  # over the drafting requests
    drafting_positions: list[int]
    first_row_list: list[int]
    sampling_positions: list[int]  # [sampling requests]: each one's place in the plan
    # The layout's key when the shape and its index arrays are kept (DeviceDrafts.shape).
    layout: tuple | None = None


# Drafted steps of at most this many requests keep their shape and index arrays per layout
# (the requests' token and draft counts, which sample, which are moved back) and slots: a
# small batch runs the same layout step after step, and building them is ~50 numpy calls,
# ~42 us a batch-1 step on this CPU, in series with a host-bound verify step. Larger steps
# change layout more often than they repeat it, and their key would cost more to build.
MAX_REMEMBERED_REQUESTS = 8


class DeviceDrafts:
    """The per-slot device state of drafted steps planned in flight (module docstring)."""

    def __init__(
        self,
        device: torch.device,
        max_model_len: int,
        min_n: int,
        max_n: int,
        synthetic_acceptance: float | None = None,
        kernels: bool = False,
    ) -> None:
        self.device = device
        # The three launches of kernels/draft_steps.py instead of the torch ops (CUDA, or
        # Triton's interpreter in tests).
        self.kernels = kernels
        self.min_n = min_n
        self.max_n = max_n
        self.synthetic_acceptance = synthetic_acceptance
        # A row of the history: max_n columns of -1 (device_ngram.py), the tokens, and room
        # past the model length for the rows a verdict writes beyond the bonus one.
        self.width = max_n + max_model_len + _MAX_DRAFTS
        self.num_slots = 0
        self.rejected = torch.zeros(0, dtype=torch.long, device=device)
        self.lengths = torch.zeros(0, dtype=torch.long, device=device)
        self.history = torch.full((0, self.width), -1, dtype=torch.int32, device=device)
        self._ones_kept = torch.ones(0, dtype=torch.long, device=device)
        self._coins = torch.Generator(device=device)
        self._coins.manual_seed(0)
        # Small steps' shapes by layout, and their index arrays by (layout, slots): shape().
        self._shapes: dict[tuple, StepShape] = {}
        self._parts: dict[tuple, dict[str, np.ndarray]] = {}

    def _fit(self, num_slots: int) -> None:
        """Grow with the persistent batch (its slots are these rows)."""
        if num_slots <= self.num_slots:
            return
        old = self.num_slots
        rejected = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        lengths = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        history = torch.full((num_slots, self.width), -1, dtype=torch.int32, device=self.device)
        rejected[:old], lengths[:old], history[:old] = self.rejected, self.lengths, self.history
        self.rejected, self.lengths, self.history = rejected, lengths, history
        self.num_slots = num_slots

    # ----- the host's side ---------------------------------------------------------------

    def shape(self, plan: StepPlan, sampling_rows: list[tuple[int, int]]) -> StepShape:
        """The step's draft layout (kept per layout for small steps: StepShape.layout)."""
        scheduled = plan.scheduled
        layout = None
        if len(scheduled) <= MAX_REMEMBERED_REQUESTS:
            # What decides every array of the shape and of extra_parts but the slots
            # (sampling_rows follow from which requests sample and their draft counts).
            layout = tuple(
                [
                    (
                        s.num_tokens,
                        len(s.draft_token_ids),
                        s.output_index >= 0,
                        bool(s.draft_token_ids) and s.draft_token_ids[0] < 0,
                        s.num_unverified_before > 0,
                    )
                    for s in scheduled
                ]
            )
            kept = self._shapes.get(layout)
            if kept is not None:
                return kept
        shape = self._new_shape(scheduled, sampling_rows)
        if layout is not None:
            shape.layout = layout
            remember_bounded(self._shapes, layout, shape)
        return shape

    def _new_shape(self, scheduled: list, sampling_rows: list[tuple[int, int]]) -> StepShape:
        num_drafts = np.fromiter(
            (len(s.draft_token_ids) for s in scheduled), dtype=np.int64, count=len(scheduled)
        )
        shifted = np.fromiter(
            (s.num_unverified_before > 0 for s in scheduled), dtype=np.int64, count=len(scheduled)
        )
        drafting = np.fromiter(
            (p for p, s in enumerate(scheduled) if s.draft_token_ids and s.draft_token_ids[0] < 0),
            dtype=np.int64,
        )
        rows = np.asarray(sampling_rows, dtype=np.int64).reshape(-1, 2)
        row_positions, row_offsets = rows[:, 0], rows[:, 1]
        first_rows = np.flatnonzero(row_offsets == 0)
        return StepShape(
            num_drafts=num_drafts,
            drafting=drafting,
            shifted=shifted,
            row_positions=row_positions,
            row_offsets=row_offsets,
            first_rows=first_rows,
            max_drafts=int(num_drafts[row_positions[first_rows]].max()) if first_rows.size else 0,
            any_shifted=bool(shifted.any()),
            max_device_drafts=int(num_drafts[drafting].max()) if drafting.size else 0,
            drafting_positions=drafting.tolist(),
            first_row_list=first_rows.tolist(),
            sampling_positions=row_positions[first_rows].tolist(),
        )

    def _ngram_width(self, plan: StepPlan, shape: StepShape) -> int:
        """History columns the drafting requests can have in this step (a step's value, not
        its layout's: it grows with the requests)."""
        scheduled = plan.scheduled
        width = 1 + max(
            scheduled[p].num_computed_before + scheduled[p].num_tokens
            for p in shape.drafting_positions
        )
        return min(self.max_n + width, self.width)

    def extra_parts(self, shape: StepShape) -> ExtraParts:
        """The step's index arrays, for the step's one copy (StepInputBuilder.build); kept
        with the shape's layout and the slots (read only: the builder copies them)."""

        def kept_parts(
            slots: np.ndarray, query_start_loc: np.ndarray, logits_indices: np.ndarray
        ) -> dict[str, np.ndarray]:
            # query_start_loc and logits_indices follow from the layout.
            key = (shape.layout, slots.tobytes())
            out = self._parts.get(key)
            if out is None:
                out = parts(slots, query_start_loc, logits_indices)
                remember_bounded(self._parts, key, out)
            return out

        def parts(
            slots: np.ndarray, query_start_loc: np.ndarray, logits_indices: np.ndarray
        ) -> dict[str, np.ndarray]:
            out: dict[str, np.ndarray] = {}
            num_tokens = int(query_start_loc[-1])
            query_lens = np.diff(query_start_loc)
            if shape.first_rows.size:
                requests = shape.row_positions[shape.first_rows]
                num_rows = shape.row_positions.size
                drafts = shape.num_drafts[requests]
                columns = np.arange(shape.max_drafts + 1)
                grid = np.minimum(shape.first_rows[:, None] + columns, num_rows - 1)
                # Columns past a request's drafts are never accepted.
                within = columns[None, :] < drafts[:, None]
                row_slots = slots[shape.row_positions]
                out["extra_first_rows"] = shape.first_rows
                out["extra_request_slots"] = slots[requests]
                out["extra_num_drafts"] = drafts
                out["extra_grid"] = grid.reshape(-1)
                out["extra_grid_within"] = within.reshape(-1)
                out["extra_row_draft_index"] = np.minimum(logits_indices + 1, num_tokens - 1)
                out["extra_row_request"] = np.cumsum(shape.row_offsets == 0) - 1
                out["extra_row_offsets"] = shape.row_offsets
                out["extra_row_slots"] = row_slots
                out["extra_row_base"] = row_slots * self.width + self.max_n + shape.row_offsets
            if shape.shifted.any() and self.kernels:
                requests = shape.row_positions[shape.first_rows]
                row_first = np.zeros(len(query_lens), dtype=np.int64)
                row_count = np.zeros(len(query_lens), dtype=np.int64)
                row_first[requests] = shape.first_rows
                row_count[requests] = shape.num_drafts[requests] + 1
                out["extra_shifted"] = shape.shifted
                out["extra_row_first"] = row_first
                out["extra_row_count"] = row_count
            elif shape.shifted.any():
                token_request = np.repeat(np.arange(len(query_lens)), query_lens)
                out["extra_shifted"] = shape.shifted
                out["extra_token_request"] = token_request
                out["extra_token_slots"] = slots[token_request]
                out["extra_row_positions"] = shape.row_positions
            if shape.drafting.size:
                counts = shape.num_drafts[shape.drafting]
                within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
                out["extra_draft_slots"] = slots[shape.drafting]
                out["extra_draft_first_tokens"] = query_start_loc[shape.drafting] + 1
                out["extra_draft_counts"] = counts
                out["extra_draft_tokens"] = (
                    np.repeat(query_start_loc[shape.drafting] + 1, counts) + within
                )
                out["extra_draft_flat"] = (
                    np.repeat(np.arange(len(counts)), counts) * int(counts.max()) + within
                )
            return out

        return parts if shape.layout is None else kept_parts

    # ----- before the forward ------------------------------------------------------------

    def prepare(
        self,
        plan: StepPlan,
        shape: StepShape,
        inputs: StepInputs,
        input_ids: torch.Tensor,
        batch: PersistentBatch,
        states: RequestStates,
    ) -> torch.Tensor:
        """Record new requests' tokens, fill the device drafts into input_ids and move steps
        planned behind an unread verify step back (all in place); returns input_ids."""
        self._fit(batch.num_slots)
        if plan.new_requests:
            self._record_new_requests(plan, batch, states)
        extra = inputs.extra
        if self.kernels:
            return self._prepare_in_kernels(plan, shape, inputs, input_ids, batch)
        if shape.drafting_positions:
            slots = extra["extra_draft_slots"]
            drafts = ngram_drafts(
                self.history[slots, : self._ngram_width(plan, shape)],
                self.lengths[slots],
                shape.max_device_drafts,
                self.min_n,
                self.max_n,
            )
            if input_ids.dtype != torch.long:
                input_ids = input_ids.long()
            input_ids[extra["extra_draft_tokens"]] = drafts.view(-1)[extra["extra_draft_flat"]]
        if "extra_shifted" in extra:
            self._move_back(inputs, batch)
        return input_ids

    def _prepare_in_kernels(
        self,
        plan: StepPlan,
        shape: StepShape,
        inputs: StepInputs,
        input_ids: torch.Tensor,
        batch: PersistentBatch,
    ) -> torch.Tensor:
        """prepare's device work in two launches (kernels/draft_steps.py)."""
        # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
        # triton; tests/model/test_fused_kernel_dispatch.py).
        from ladle.kernels.draft_steps import move_back_, ngram_drafts_

        extra = inputs.extra
        if shape.drafting_positions:
            ngram_drafts_(
                self.history,
                self.lengths,
                extra["extra_draft_slots"],
                extra["extra_draft_first_tokens"],
                extra["extra_draft_counts"],
                input_ids,
                self._ngram_width(plan, shape) - self.max_n,
                self.min_n,
                self.max_n,
            )
        if "extra_shifted" in extra:
            metadata = inputs.attn_metadata
            assert inputs.request_slots is not None
            move_back_(
                self.rejected,
                inputs.request_slots,
                extra["extra_shifted"],
                metadata.query_start_loc,
                extra["extra_row_first"],
                extra["extra_row_count"],
                batch.block_table,
                metadata.block_size,
                inputs.positions,
                metadata.slot_mapping,
                metadata.seq_lens,
                inputs.sampling_rows["step"],
            )
            self._read_back_lengths(inputs)
        return input_ids

    def _read_back_lengths(self, inputs: StepInputs) -> None:
        """On the CPU, the moved sequence lengths into the host metadata (module docstring)."""
        if self.device.type == "cpu":
            metadata = inputs.attn_metadata
            lengths = metadata.seq_lens.tolist()
            inputs.attn_metadata = dataclasses.replace(
                metadata, seq_lens_host=lengths, max_seq_len=max(lengths), backend_cache={}
            )

    def _record_new_requests(
        self, plan: StepPlan, batch: PersistentBatch, states: RequestStates
    ) -> None:
        """A request new to the batch (first run, or resumed): its known tokens, all on the
        host then (a request resumes only once its steps are read)."""
        slots, _ = batch.slots_for([s.request_id for s in plan.scheduled])
        slot_of = dict(zip(plan.request_ids(), slots.tolist()))
        flat, tokens, new_slots, new_lengths = [], [], [], []
        for new in plan.new_requests:
            slot = slot_of[new.request_id]
            known = states[new.request_id].all_token_ids
            flat.append(np.arange(len(known)) + slot * self.width + self.max_n)
            tokens.append(np.asarray(known, dtype=np.int32))
            new_slots.append(slot)
            new_lengths.append(len(known))
        device = self.device
        self.history.view(-1)[torch.from_numpy(np.concatenate(flat)).to(device)] = torch.from_numpy(
            np.concatenate(tokens)
        ).to(device)
        self.lengths[torch.tensor(new_slots, device=device)] = torch.tensor(
            new_lengths, device=device
        )

    def _move_back(self, inputs: StepInputs, batch: PersistentBatch) -> None:
        """Requests planned as if their unread step accepted every draft: positions, KV slots,
        sequence lengths and sampling counters back by the drafts that step rejected."""
        extra = inputs.extra
        metadata = inputs.attn_metadata
        back = self.rejected[inputs.request_slots] * extra["extra_shifted"]  # [requests]
        positions = inputs.positions
        positions.sub_(back[extra["extra_token_request"]])
        block_size = metadata.block_size
        blocks = batch.block_table[extra["extra_token_slots"], positions // block_size]
        metadata.slot_mapping.copy_(blocks.long() * block_size + positions % block_size)
        back = back.to(metadata.seq_lens.dtype)
        metadata.seq_lens.sub_(back)
        steps = inputs.sampling_rows["step"]  # int32, as seq_lens
        steps.sub_(back[extra["extra_row_positions"]])
        self._read_back_lengths(inputs)

    # ----- after sampling ----------------------------------------------------------------

    def judge(
        self,
        plan: StepPlan,
        shape: StepShape,
        inputs: StepInputs,
        input_ids: torch.Tensor,
        sampled: torch.Tensor,
        last_sampled: torch.Tensor,
    ) -> Verdict:
        """The step's verdict (module docstring); writes each sampling request's last token,
        rejected drafts and emitted tokens into its slot."""
        extra = inputs.extra
        positions = shape.sampling_positions
        if self.kernels:
            return self._judge_in_kernel(shape, inputs, input_ids, sampled, last_sampled)
        if not shape.max_drafts:
            return self._record_plain(inputs, sampled, last_sampled, positions)
        # Row j decides on draft j, the token after the row's own in the chunk (bonus rows
        # compare with anything: the grid never reads them).
        row_drafts = input_ids[extra["extra_row_draft_index"]]
        if row_drafts.dtype != sampled.dtype:
            row_drafts = row_drafts.to(sampled.dtype)
        if self.synthetic_acceptance is None:
            accepts = sampled == row_drafts
        else:
            coins = torch.rand(sampled.shape[0], generator=self._coins, device=self.device)
            accepts = coins < self.synthetic_acceptance
        num_requests = shape.first_rows.size
        words = self._verdict_words(sampled.shape[0], num_requests)
        row_tokens, num_accepted = words[: sampled.shape[0]], words[sampled.shape[0] :]
        leading = (accepts[extra["extra_grid"]] * extra["extra_grid_within"]).view(
            num_requests, shape.max_drafts + 1
        )
        torch.sum(leading.cumprod(dim=1), dim=1, out=num_accepted)
        torch.where(
            extra["extra_row_offsets"] < num_accepted[extra["extra_row_request"]],
            row_drafts,
            sampled,
            out=row_tokens,
        )
        request_slots = extra["extra_request_slots"]
        bonus_rows = extra["extra_first_rows"] + num_accepted
        last_sampled.index_copy_(0, request_slots, sampled[bonus_rows])
        self.rejected.index_copy_(0, request_slots, extra["extra_num_drafts"] - num_accepted)
        # Every row's token onto its request's history; those past the bonus row lie beyond
        # the new length, where nothing reads them.
        at = extra["extra_row_base"] + self.lengths[extra["extra_row_slots"]]
        self.history.view(-1)[at] = row_tokens.to(torch.int32)
        self.lengths.index_add_(0, request_slots, num_accepted + 1)
        return Verdict(row_tokens, num_accepted, shape.first_row_list, positions, words)

    def _verdict_words(self, num_rows: int, num_requests: int) -> torch.Tensor:
        """A new [rows + requests] int64 tensor for a verdict's row tokens and accept counts
        (Verdict.words; new each step: the host's copy of the last one may be in flight)."""
        return torch.empty(num_rows + num_requests, dtype=torch.long, device=self.device)

    def _judge_in_kernel(
        self,
        shape: StepShape,
        inputs: StepInputs,
        input_ids: torch.Tensor,
        sampled: torch.Tensor,
        last_sampled: torch.Tensor,
    ) -> Verdict:
        """judge in one launch (kernels/draft_steps.py); the coins, when synthetic, drawn
        # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
        # triton; tests/model/test_fused_kernel_dispatch.py).
        from the same generator as the torch path's."""
        from ladle.kernels.draft_steps import judge_

        extra = inputs.extra
        coins = None
        if self.synthetic_acceptance is not None and shape.max_drafts:
            coins = torch.rand(sampled.shape[0], generator=self._coins, device=self.device)
        words = self._verdict_words(sampled.shape[0], shape.first_rows.size)
        row_tokens, num_accepted = judge_(
            words,
            sampled,
            input_ids,
            extra["extra_row_draft_index"],
            extra["extra_first_rows"],
            extra["extra_num_drafts"],
            extra["extra_request_slots"],
            coins,
            self.synthetic_acceptance or 0.0,
            last_sampled,
            self.rejected,
            self.history,
            self.max_n,
            self.lengths,
        )
        positions = shape.sampling_positions
        if not shape.max_drafts:
            return Verdict(row_tokens, None, shape.first_row_list, positions)
        return Verdict(row_tokens, num_accepted, shape.first_row_list, positions, words)

    def _record_plain(
        self,
        inputs: StepInputs,
        sampled: torch.Tensor,
        last_sampled: torch.Tensor,
        positions: list[int],
    ) -> Verdict:
        """A step without drafts (one row a request): its tokens onto the slots, as a plain
        step records them, and onto the histories."""
        extra = inputs.extra
        slots = inputs.sampling_slots
        last_sampled.index_copy_(0, slots, sampled)
        self.history.view(-1)[extra["extra_row_base"] + self.lengths[slots]] = sampled.to(
            torch.int32
        )
        self.lengths.index_add_(0, slots, self._ones(slots.shape[0]))
        return Verdict(sampled, None, list(range(len(positions))), positions)

    def _ones(self, size: int) -> torch.Tensor:
        if self._ones_kept.shape[0] < size:
            self._ones_kept = torch.ones(max(size, 64), dtype=torch.long, device=self.device)
        return self._ones_kept[:size]
