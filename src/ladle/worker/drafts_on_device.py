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

The host reads the verdict with the sampled ids (one copy more); it never waits for it earlier.
On the CPU the corrected sequence lengths are read back at once (the CPU attention reads host
lengths, and there a read costs nothing); on CUDA the host keeps the upper bounds, which the
Triton attention reads only as bounds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ladle.protocol.step import StepPlan
from ladle.worker.device_ngram import ngram_drafts
from ladle.worker.persistent_batch import PersistentBatch
from ladle.worker.request_states import RequestStates
from ladle.worker.step_inputs import StepInputs


@dataclass
class Verdict:
    """A sampled step's verdict, on the device until the step is read."""

    row_tokens: torch.Tensor  # [rows] int64: each row's emitted token (its draft if accepted)
    num_accepted: torch.Tensor  # [sampling requests] int64
    first_rows: np.ndarray  # [sampling requests]: each one's first sampling row
    positions: list[int]  # [sampling requests]: each one's place in the plan

    def emitted(self, num_scheduled: int, row_tokens: list[int], accepted: list[int]):
        """Per scheduled request, the tokens it emits (host lists of the copies)."""
        emitted: list[list[int]] = [[] for _ in range(num_scheduled)]
        for position, first, count in zip(self.positions, self.first_rows.tolist(), accepted):
            emitted[position] = row_tokens[first : first + count + 1]
        return emitted


class DeviceDrafts:
    """The per-slot device state of drafted steps planned in flight (module docstring)."""

    def __init__(
        self,
        device: torch.device,
        max_model_len: int,
        min_n: int,
        max_n: int,
        synthetic_acceptance: float | None = None,
    ) -> None:
        self.device = device
        self.min_n = min_n
        self.max_n = max_n
        self.synthetic_acceptance = synthetic_acceptance
        # One column past the model length: rows that emit nothing write there.
        self.width = max_model_len + 1
        self.num_slots = 0
        self.rejected = torch.zeros(0, dtype=torch.long, device=device)
        self.lengths = torch.zeros(0, dtype=torch.long, device=device)
        self.history = torch.zeros((0, self.width), dtype=torch.int32, device=device)
        self._coins = torch.Generator(device=device)
        self._coins.manual_seed(0)

    def _fit(self, num_slots: int) -> None:
        """Grow with the persistent batch (its slots are these rows)."""
        if num_slots <= self.num_slots:
            return
        old = self.num_slots
        rejected = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        lengths = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        history = torch.zeros((num_slots, self.width), dtype=torch.int32, device=self.device)
        rejected[:old], lengths[:old], history[:old] = self.rejected, self.lengths, self.history
        self.rejected, self.lengths, self.history = rejected, lengths, history
        self.num_slots = num_slots

    # ----- before the forward ------------------------------------------------------------

    def prepare(
        self,
        plan: StepPlan,
        inputs: StepInputs,
        input_ids: torch.Tensor,
        batch: PersistentBatch,
        states: RequestStates,
    ) -> torch.Tensor:
        """Record new requests' tokens, fill the device drafts into input_ids and move steps
        planned behind an unread verify step back (all in place); returns input_ids."""
        self._fit(batch.num_slots)
        scheduled = plan.scheduled
        slots, _ = batch.slots_for([s.request_id for s in scheduled])
        self._record_new_requests(plan, slots, states)
        starts = inputs.attn_metadata.query_start_loc_host
        drafting = [
            p for p, s in enumerate(scheduled) if s.draft_token_ids and s.draft_token_ids[0] < 0
        ]
        if drafting:
            input_ids = self._fill_drafts(scheduled, drafting, slots, starts, input_ids)
        shifted = [p for p, s in enumerate(scheduled) if s.num_unverified_before]
        if shifted:
            self._move_back(plan, inputs, batch, slots, shifted, starts)
        return input_ids

    def _record_new_requests(
        self, plan: StepPlan, slots: np.ndarray, states: RequestStates
    ) -> None:
        """A request new to the batch (first run, or resumed): its known tokens, all on the
        host then (a request resumes only once its steps are read)."""
        if not plan.new_requests:
            return
        slot_of = {s.request_id: slot for s, slot in zip(plan.scheduled, slots.tolist())}
        flat, tokens, new_slots, new_lengths = [], [], [], []
        for new in plan.new_requests:
            slot = slot_of[new.request_id]
            known = states[new.request_id].all_token_ids
            flat.append(np.arange(len(known)) + slot * self.width)
            tokens.append(np.asarray(known, dtype=np.int32))
            new_slots.append(slot)
            new_lengths.append(len(known))
        device = self.device
        self.history.view(-1)[torch.from_numpy(np.concatenate(flat)).to(device)] = (
            torch.from_numpy(np.concatenate(tokens)).to(device)
        )
        self.lengths[torch.tensor(new_slots, device=device)] = torch.tensor(
            new_lengths, device=device
        )

    def _fill_drafts(
        self,
        scheduled: list,
        drafting: list[int],
        slots: np.ndarray,
        starts: list[int],
        input_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Each drafting request's n-gram drafts, from its tokens on the device, into the
        draft positions of input_ids (after its one known token)."""
        device = self.device
        counts = [len(scheduled[p].draft_token_ids) for p in drafting]
        most = max(counts)
        # Worst-case known tokens bound each row's history; + the drafts' room.
        width = min(
            self.width,
            max(scheduled[p].num_computed_before + scheduled[p].num_tokens for p in drafting) + 1,
        )
        row_slots = torch.from_numpy(slots[drafting]).to(device)
        drafts = ngram_drafts(
            self.history[row_slots, :width], self.lengths[row_slots], most, self.min_n, self.max_n
        )
        token_index = np.concatenate([starts[p] + 1 + np.arange(n) for p, n in zip(drafting, counts)])
        row = np.repeat(np.arange(len(drafting)), counts)
        column = np.concatenate([np.arange(n) for n in counts])
        if input_ids.dtype != torch.long:
            input_ids = input_ids.long()
        input_ids[torch.from_numpy(token_index).to(device)] = drafts[
            torch.from_numpy(row).to(device), torch.from_numpy(column).to(device)
        ]
        return input_ids

    def _move_back(
        self,
        plan: StepPlan,
        inputs: StepInputs,
        batch: PersistentBatch,
        slots: np.ndarray,
        shifted: list[int],
        starts: list[int],
    ) -> None:
        """Requests planned as if their unread step accepted every draft: positions, KV slots,
        sequence lengths and sampling counters back by the drafts that step rejected."""
        device = self.device
        metadata = inputs.attn_metadata
        counts = [starts[p + 1] - starts[p] for p in shifted]
        token_index = torch.from_numpy(
            np.concatenate([starts[p] + np.arange(n) for p, n in zip(shifted, counts)])
        ).to(device)
        request_slots = torch.from_numpy(slots[shifted]).to(device)
        back = self.rejected[request_slots]  # [shifted]
        token_request = torch.from_numpy(np.repeat(np.arange(len(shifted)), counts)).to(device)
        positions = inputs.positions[token_index] - back[token_request]
        inputs.positions[token_index] = positions
        block_size = metadata.block_size
        blocks = batch.block_table[request_slots[token_request], positions // block_size]
        metadata.slot_mapping[token_index] = blocks.long() * block_size + positions % block_size
        shifted_index = torch.tensor(shifted, device=device)
        seq_lens = metadata.seq_lens
        seq_lens[shifted_index] = (seq_lens[shifted_index] - back).to(seq_lens.dtype)
        row_index, row_request = [], []
        shifted_at = {p: i for i, p in enumerate(shifted)}
        for row, (position, _) in enumerate(plan.sampling_rows()):
            if position in shifted_at:
                row_index.append(row)
                row_request.append(shifted_at[position])
        if row_index:
            steps = inputs.sampling_rows["step"]
            rows = torch.tensor(row_index, device=device)
            moved = steps[rows] - back[torch.tensor(row_request, device=device)]
            steps[rows] = moved.to(steps.dtype)
        if device.type == "cpu":
            lengths = metadata.seq_lens.tolist()
            inputs.attn_metadata = dataclasses.replace(
                metadata, seq_lens_host=lengths, max_seq_len=max(lengths), backend_cache={}
            )

    # ----- after sampling ----------------------------------------------------------------

    def judge(
        self,
        plan: StepPlan,
        sampling_rows: list[tuple[int, int]],
        inputs: StepInputs,
        input_ids: torch.Tensor,
        sampled: torch.Tensor,
        last_sampled: torch.Tensor,
    ) -> Verdict:
        """The step's verdict (module docstring); writes each sampling request's last token,
        rejected drafts and emitted tokens into its slot."""
        device = self.device
        scheduled = plan.scheduled
        positions: list[int] = []
        first_rows: list[int] = []
        num_drafts: list[int] = []
        row_request = np.empty(len(sampling_rows), dtype=np.int64)
        row_offset = np.empty(len(sampling_rows), dtype=np.int64)
        for row, (position, offset) in enumerate(sampling_rows):
            if offset == 0:
                positions.append(position)
                first_rows.append(row)
                num_drafts.append(len(scheduled[position].draft_token_ids))
            row_request[row] = len(positions) - 1
            row_offset[row] = offset
        first = np.asarray(first_rows, dtype=np.int64)
        drafts = np.asarray(num_drafts, dtype=np.int64)
        host = np.concatenate([first, drafts, row_request, row_offset])
        packed = torch.from_numpy(host).to(device, non_blocking=True)
        num_requests, num_rows = len(positions), len(sampling_rows)
        first_dev = packed[:num_requests]
        drafts_dev = packed[num_requests : 2 * num_requests]
        request_dev = packed[2 * num_requests : 2 * num_requests + num_rows]
        offset_dev = packed[2 * num_requests + num_rows :]
        has_draft = offset_dev < drafts_dev[request_dev]
        # Row j decides on draft j, the token after the row's own in the chunk.
        after = (inputs.logits_indices + 1).clamp(max=input_ids.shape[0] - 1)
        row_drafts = torch.where(has_draft, input_ids[after].long(), -1)
        if self.synthetic_acceptance is None:
            accepts = has_draft & (sampled == row_drafts)
        else:
            coins = torch.rand(num_rows, generator=self._coins, device=device)
            accepts = has_draft & (coins < self.synthetic_acceptance)
        width = int(drafts.max()) + 1 if num_requests else 1
        columns = torch.arange(width, device=device)
        grid = (first_dev[:, None] + columns).clamp(max=num_rows - 1)
        leading = accepts[grid] & (columns[None, :] < drafts_dev[:, None])
        num_accepted = leading.long().cumprod(dim=1).sum(dim=1)
        row_tokens = torch.where(
            offset_dev < num_accepted[request_dev], row_drafts, sampled.long()
        )
        request_slots = inputs.sampling_slots[first_dev]
        last_sampled.index_copy_(0, request_slots, sampled[first_dev + num_accepted].long())
        self.rejected.index_copy_(0, request_slots, drafts_dev - num_accepted)
        # The emitted tokens onto each request's history (rows past the bonus one: nowhere).
        row_slots = inputs.sampling_slots
        emits = offset_dev <= num_accepted[request_dev]
        column = torch.where(
            emits, (self.lengths[row_slots] + offset_dev).clamp(max=self.width - 2), self.width - 1
        )
        self.history.view(-1)[row_slots * self.width + column] = row_tokens.to(torch.int32)
        self.lengths.index_add_(0, request_slots, num_accepted + 1)
        return Verdict(row_tokens, num_accepted, first, positions)
