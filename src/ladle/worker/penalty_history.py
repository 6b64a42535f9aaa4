"""The token ids the repetition / presence / frequency penalties read, kept on the device.

Each request with a penalty holds a row while it lives: its prompt ids, written once when it
first samples, and its output ids, where every step writes the token it sampled at the index of
that token (the request's output count). So the sampler reads a penalty row's tokens where they
already are, and a penalty request needs no token of the host: its next step may be built and
launched before the host has read the step before (overlapped scheduling, engine/overlap.py).

Writing a token at its own index (not appending, not counting) makes a step safe to repeat: a
fault-isolation probe or a re-run writes the same id to the same place. Rows are padded with
vocab_size, which the sampler's scatters drop (sample/penalties.py), so the gathered tensors are
exactly those the host would build from its lists and the tokens are the same.

A request takes a row from its host lists when it first samples: a new request has no output
yet, and a preempted one resumes only once all its tokens are on the host (the scheduler waits
for its pending token), so the host lists are complete at that point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ladle.worker.request_states import RequestState

# Output ids a row has room for at first; the width doubles when a row needs more.
MIN_OUTPUT_WIDTH = 64


@dataclass
class PenaltyRows:
    """One step's penalty rows: which sampling rows have one, and where it lives."""

    batch_rows: torch.Tensor  # [num_penalty] int64: rows of the sampling batch, on the device
    history_rows: torch.Tensor  # [num_penalty] int64: rows of the history, on the device
    output_index: torch.Tensor  # [num_penalty] int64: where this step's token goes
    num_sampling_rows: int
    prompt_width: int  # longest prompt among the penalty rows (at least 1)
    output_width: int  # most output tokens among the penalty rows (at least 1)


class PenaltyHistory:
    """Prompt and output token ids of the requests that use penalties, one row each."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self._row_of: dict[str, int] = {}
        self._prompt_length: dict[str, int] = {}
        self._free_rows: list[int] = []
        self.prompt_ids = self._empty(0, 1)
        self.output_ids = self._empty(0, 1)

    def _empty(self, num_rows: int, width: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.full((num_rows, width), self.vocab_size, dtype=dtype, device=self.device)

    @property
    def num_rows(self) -> int:
        return self.prompt_ids.shape[0]

    def rows_for(
        self, requests: Sequence[RequestState], num_output_tokens: Sequence[int]
    ) -> PenaltyRows | None:
        """The penalty rows of a step's sampling requests (None when none uses a penalty),
        taking and filling rows for requests that sample with a penalty for the first time."""
        batch_rows, history_rows, output_index = [], [], []
        prompt_width = output_width = 1
        for position, (request, num_output) in enumerate(zip(requests, num_output_tokens)):
            if not request.sampling_params.uses_penalties:
                continue
            row = self._row_of.get(request.request_id)
            if row is None:
                row = self._take_row(request, num_output)
            batch_rows.append(position)
            history_rows.append(row)
            output_index.append(num_output)
            prompt_width = max(prompt_width, self._prompt_length[request.request_id])
            output_width = max(output_width, num_output)
        if not batch_rows:
            return None
        if output_width >= self.output_ids.shape[1]:
            # Room for this step's token: the width doubles as outputs grow, so a request
            # without max_tokens (the room left in the model) holds only what it wrote.
            self.output_ids = self._grown(self.output_ids, self.num_rows, 2 * output_width)
        packed = torch.tensor([batch_rows, history_rows, output_index], dtype=torch.int64)
        on_device = packed.to(self.device, non_blocking=True)
        return PenaltyRows(
            batch_rows=on_device[0],
            history_rows=on_device[1],
            output_index=on_device[2],
            num_sampling_rows=len(requests),
            prompt_width=prompt_width,
            output_width=output_width,
        )

    def token_ids(self, rows: PenaltyRows) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt, output) [num_sampling_rows, width] int64 on the device, padded with
        vocab_size; rows without a penalty hold padding only (the sampler leaves them alone)."""
        prompt = self._empty(rows.num_sampling_rows, rows.prompt_width, torch.int64)
        prompt[rows.batch_rows] = self.prompt_ids[rows.history_rows, : rows.prompt_width].long()
        # Only the tokens before this step's index: a repeated step (a fault-isolation probe,
        # then the re-run) must not read the token it wrote the first time as a past one.
        gathered = self.output_ids[rows.history_rows, : rows.output_width]
        columns = torch.arange(rows.output_width, device=self.device)
        gathered = gathered.masked_fill(
            columns[None, :] >= rows.output_index[:, None], self.vocab_size
        )
        output = self._empty(rows.num_sampling_rows, rows.output_width, torch.int64)
        output[rows.batch_rows] = gathered.long()
        return prompt, output

    def record(self, rows: PenaltyRows, sampled: torch.Tensor) -> None:
        """Write the step's sampled ids (all sampling rows, on the device) at their index."""
        self.output_ids[rows.history_rows, rows.output_index] = sampled[rows.batch_rows].to(
            self.output_ids.dtype
        )

    def write_drafts(self, request_id: str, output_index: int, draft_token_ids: list[int]) -> None:
        """Write a request's draft tokens at the output indices they would take, so the step's
        row after j drafts sees them as outputs (each row reads only the indices before its own,
        and record() then writes what the rows really sampled)."""
        row = self._row_of.get(request_id)
        if row is None:
            return  # no penalty: nothing reads its outputs here
        end = output_index + len(draft_token_ids)
        self.output_ids[row, output_index:end] = torch.tensor(
            draft_token_ids, dtype=torch.int32
        ).to(self.device, non_blocking=True)

    def release(self, request_ids: Sequence[str]) -> None:
        """Free the rows of requests that ended or were preempted (unknown ids are ignored)."""
        for request_id in request_ids:
            row = self._row_of.pop(request_id, None)
            if row is not None:
                del self._prompt_length[request_id]
                self._free_rows.append(row)

    def _take_row(self, request: RequestState, num_output: int) -> int:
        prompt = request.prompt_token_ids
        known_output = request.output_token_ids[:num_output]
        if len(known_output) < num_output:
            raise RuntimeError(
                f"request {request.request_id} first samples with a penalty while "
                f"{num_output - len(known_output)} of its tokens are not on the host"
            )
        self._make_room(len(prompt), max(MIN_OUTPUT_WIDTH, 2 * (num_output + 1)))
        row = self._free_rows.pop()
        self._row_of[request.request_id] = row
        self._prompt_length[request.request_id] = max(1, len(prompt))
        # Stream-ordered after any write a step still queued makes to this row for its last
        # owner (a request released while its step runs), so nothing stale survives.
        self.prompt_ids[row].fill_(self.vocab_size)
        self.output_ids[row].fill_(self.vocab_size)
        if prompt:
            self.prompt_ids[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.int32).to(
                self.device, non_blocking=True
            )
        if known_output:
            self.output_ids[row, : len(known_output)] = torch.tensor(
                known_output, dtype=torch.int32
            ).to(self.device, non_blocking=True)
        return row

    def _make_room(self, prompt_length: int, output_length: int) -> None:
        """Grow to a free row and widths that fit the request (copies on the device)."""
        num_rows = self.num_rows
        new_rows = num_rows if self._free_rows else max(8, 2 * num_rows)
        prompt_width = max(self.prompt_ids.shape[1], prompt_length)
        output_width = max(self.output_ids.shape[1], output_length)
        if (new_rows, prompt_width, output_width) == (
            num_rows,
            self.prompt_ids.shape[1],
            self.output_ids.shape[1],
        ):
            return
        self.prompt_ids = self._grown(self.prompt_ids, new_rows, prompt_width)
        self.output_ids = self._grown(self.output_ids, new_rows, output_width)
        self._free_rows.extend(reversed(range(num_rows, new_rows)))

    def _grown(self, old: torch.Tensor, num_rows: int, width: int) -> torch.Tensor:
        grown = self._empty(num_rows, width)
        grown[: old.shape[0], : old.shape[1]] = old
        return grown
