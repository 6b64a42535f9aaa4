"""The persistent batch: per-request state that lives across steps, in slots.

A request takes a slot when it first runs and keeps it until it ends or is preempted. What a
slot holds stays where the step reads it and changes only where the scheduler changed something:

- its block table, on the host (for the cache slots of new tokens) and on the device (for the
  attention kernels), written only where the scheduler handed out new blocks (BlockUpdate);
  a step gathers its rows' tables on the device instead of shipping every table every step;
- the token it sampled last, on the device, so the next step reads a decode row's input id
  there while the host has not seen it yet (overlapped scheduling);
- its sampling row (temperature, top-k/p, min-p, penalties, seed: sample/metadata.py's
  ROW_DTYPES packed as int32), written on the device once when the request takes the slot; a
  step gathers its sampling rows' values and ships only each row's step counter. The rows are
  kept column by column ([len(ROW_DTYPES), slots]), so a step's gather is one launch that
  gives each value's row contiguous (the sampler's tensors, with no transpose copy).
"""

from __future__ import annotations

import numpy as np
import torch

from ladle.protocol.step import BlockUpdate
from ladle.sample.metadata import ROW_DTYPES


def _read_only_empty() -> np.ndarray:
    empty = np.zeros(0, dtype=np.int64)
    empty.flags.writeable = False
    return empty


# update_block_tables' answer when nothing changed: (flat indices, block ids), both empty.
_NO_UPDATES = (_read_only_empty(), _read_only_empty())


class PersistentBatch:
    def __init__(self, max_blocks_per_seq: int, device: torch.device, initial_slots: int) -> None:
        self.max_blocks_per_seq = max_blocks_per_seq
        self.device = device
        self._initial_slots = initial_slots
        self._slot_of: dict[str, int] = {}
        # The last slots_for call's request ids and slots; the slots max_num_blocks was last
        # asked for and its answer.
        self._last_slots: tuple[list[str] | None, np.ndarray | None] = (None, None)
        self._max_num_blocks: tuple[np.ndarray | None, int] = (None, 0)
        self._free_slots: list[int] = []
        self.num_slots = 0
        self.block_table_host = np.zeros((0, max_blocks_per_seq), dtype=np.int32)
        self.num_blocks = np.zeros(0, dtype=np.int64)
        self.block_table = torch.zeros((0, max_blocks_per_seq), dtype=torch.int32, device=device)
        # int64, as the sampler returns ids: recording a step's ids is one scatter, no cast.
        self.last_sampled = torch.zeros(0, dtype=torch.int64, device=device)
        # Column-major: [len(ROW_DTYPES), num_slots] (see the module docstring).
        self.sampling_columns = torch.zeros(
            (len(ROW_DTYPES), 0), dtype=torch.int32, device=device
        )

    def slots_for(self, request_ids: list[str]) -> tuple[np.ndarray, list[int]]:
        """Each request's slot, assigning free ones to requests new to the batch; and the
        positions (in request_ids) of those new ones, whose sampling rows must be written.
        The slots array is read-only: a step of the last step's requests (a decode batch)
        gets the same array back."""
        last_ids, last_slots = self._last_slots
        if request_ids == last_ids:
            return last_slots, []  # every one holds the slot it held then (release clears this)
        slot_of = self._slot_of
        new_positions = []
        for position, request_id in enumerate(request_ids):
            if request_id not in slot_of:
                if not self._free_slots:
                    self._grow()
                slot = self._free_slots.pop()
                self.num_blocks[slot] = 0
                slot_of[request_id] = slot
                new_positions.append(position)
        slots = np.fromiter(
            (slot_of[request_id] for request_id in request_ids),
            dtype=np.int64,
            count=len(request_ids),
        )
        slots.flags.writeable = False
        self._last_slots = (request_ids, slots)
        return slots, new_positions

    def max_num_blocks(self, slots: np.ndarray) -> int:
        """The most blocks any of these slots' tables holds. Kept for the slots array asked
        last (a decode batch asks with the same array, slots_for) until a table changes."""
        kept_slots, kept_max = self._max_num_blocks
        if slots is not kept_slots:
            kept_max = int(self.num_blocks[slots].max())
            self._max_num_blocks = (slots, kept_max)
        return kept_max

    def write_sampling_rows(self, slots: torch.Tensor, packed_rows: torch.Tensor) -> None:
        """Store new requests' packed sampling rows ([n, len(ROW_DTYPES)] int32, on the device)
        in their slots (int64, on the device)."""
        if slots.numel():
            self.sampling_columns.index_copy_(1, slots, packed_rows.t())

    def gather_sampling_columns(
        self, slots: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The packed sampling values of the given slots (int64) as contiguous
        [len(ROW_DTYPES), n] int32: one row per ROW_DTYPES entry (unpack_sampling_columns).
        out: a [len(ROW_DTYPES), n] buffer to gather into."""
        return torch.index_select(self.sampling_columns, 1, slots, out=out)

    def release(self, request_ids: list[str]) -> None:
        """Free the slots of requests that ended or were preempted (unknown ids are ignored):
        a preempted request resumes with its whole block table, in whatever slot is free then."""
        self._last_slots = (None, None)
        for request_id in request_ids:
            slot = self._slot_of.pop(request_id, None)
            if slot is not None:
                self._free_slots.append(slot)

    def clear_block_tables(self) -> None:
        """Point every table entry at the null block. Start-up steps over a temporary cache (the
        fp8 KV calibration) leave block ids behind that the real cache may not have, and a
        backend that gathers whole table rows (the CPU's batched decode) would index them."""
        self.block_table_host[:] = 0
        self.block_table.zero_()

    def update_block_tables(
        self, slots: np.ndarray, updates: list[BlockUpdate | None]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Write the updates into the host tables; returns (flat indices, block ids) for the
        device table (apply_block_updates). Rewriting an update already applied is harmless."""
        if all(update is None for update in updates):
            return _NO_UPDATES  # most decode steps: a block fills once every block_size tokens
        indices: list[np.ndarray] = []
        values: list[list[int]] = []
        width = self.max_blocks_per_seq
        for slot, update in zip(slots.tolist(), updates):
            if update is None:
                continue
            start, block_ids = update.start, update.block_ids
            end = start + len(block_ids)
            if end > width:
                raise ValueError(f"a block table of {end} blocks exceeds the {width} per sequence")
            self.block_table_host[slot, start:end] = block_ids
            self.num_blocks[slot] = end
            self._max_num_blocks = (None, 0)
            indices.append(np.arange(slot * width + start, slot * width + end))
            values.append(block_ids)
        if not indices:
            return _NO_UPDATES
        return np.concatenate(indices), np.fromiter(
            (block for ids in values for block in ids), dtype=np.int64
        )

    def apply_block_updates(self, flat_indices: torch.Tensor, block_ids: torch.Tensor) -> None:
        """Mirror update_block_tables' writes on the device (indices int64, ids int32)."""
        if flat_indices.numel():
            self.block_table.view(-1).index_copy_(0, flat_indices, block_ids)

    def _grow(self) -> None:
        old = self.num_slots
        new = max(2 * old, self._initial_slots)
        width = self.max_blocks_per_seq
        table_host = np.zeros((new, width), dtype=np.int32)
        table_host[:old] = self.block_table_host
        self.block_table_host = table_host
        num_blocks = np.zeros(new, dtype=np.int64)
        num_blocks[:old] = self.num_blocks
        self.num_blocks = num_blocks
        table = torch.zeros((new, width), dtype=torch.int32, device=self.device)
        table[:old] = self.block_table
        self.block_table = table
        last_sampled = torch.zeros(new, dtype=torch.int64, device=self.device)
        last_sampled[:old] = self.last_sampled
        self.last_sampled = last_sampled
        columns = torch.zeros((len(ROW_DTYPES), new), dtype=torch.int32, device=self.device)
        columns[:, :old] = self.sampling_columns
        self.sampling_columns = columns
        self.num_slots = new
        self._free_slots.extend(reversed(range(old, new)))
