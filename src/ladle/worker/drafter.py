"""The draft network in the worker (speculative decoding with a draft model or an EAGLE head):
right after the target's step is sampled, it computes the next step's drafts on the device.

Its KV cache is a paged pool of its own with the target's block ids: the same number of blocks,
the same block tables and slot mapping (no second block manager). Per step:

1. A pass over the step's tokens writes the draft network's KV for them (rows the target
   rejects lie beyond the request's computed tokens and are written again later). An EAGLE head
   takes at position i the token x_{i+1} with the target's feature at i: the step's next input
   token, or for a row that sampled, the token the target sampled there (for accepted rows that
   is the draft itself, for the last accepted row the new token).
2. For each request the scheduler reserved lookahead slots for (ScheduledRequest.
   num_lookahead_tokens), the number of drafts the target accepted is found on the device (a
   draft is accepted while it equals the token sampled before it, as sample/rejection.py's
   host walk), and greedy drafting chains from the new token: a draft model feeds it (then its
   own drafts) one position at a time; an EAGLE head's first draft comes from the pass's row at
   the last accepted position, then it feeds its own drafts with its own output feature.

Drafting is greedy (argmax): drafts are point masses, which the existing exact acceptance
verifies for every sampling setting. No host sync is needed on CUDA: the chained steps'
attention metadata is built on the device (decode rows read only device lengths); the CPU
backends read host lengths, and there a sync costs nothing.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from ladle.attention.metadata import AttentionMetadata
from ladle.model.loader.draft_loading import DraftNetwork
from ladle.protocol.step import StepPlan
from ladle.worker.request_states import RequestStates
from ladle.worker.step_inputs import StepInputs


@dataclass
class DraftBatch:
    """Drafts being computed on the device for some of a step's requests."""

    request_ids: list[str]
    lengths: list[int]  # drafts wanted per request (its lookahead)
    drafts: torch.Tensor  # [len(request_ids), max(lengths)] int64; host copy once read
    seconds: float  # the drafting's host time (all of it on the CPU)
    events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None  # CUDA: device time

    def read(self) -> tuple[dict[str, list[int]], float]:
        """(request id -> its drafts, seconds the drafting took); call after the step's copy
        to the host completed."""
        rows = self.drafts.tolist()
        drafts = {rid: row[:n] for rid, row, n in zip(self.request_ids, rows, self.lengths)}
        if self.events is not None:
            start, end = self.events
            end.synchronize()
            return drafts, start.elapsed_time(end) / 1000.0
        return drafts, self.seconds


@dataclass
class TargetOutputs:
    """What the target's forward gives the drafter: the step's resolved input ids, the final
    hidden states of every row, and (EAGLE-3) the aux features of every row."""

    input_ids: torch.Tensor
    hidden: torch.Tensor
    features: torch.Tensor | None


class ModelDrafter:
    def __init__(
        self,
        network: DraftNetwork,
        target: torch.nn.Module,
        device: torch.device,
        block_size: int,
    ) -> None:
        self.network = network
        self.method = network.method
        self.device = device
        self.block_size = block_size
        self.kv_caches: list[torch.Tensor] = []  # set by the Worker with the target's pool
        self.num_failures = 0
        if network.head is not None:
            embed = target.model.embed_tokens
            network.head.share_target(embed, lambda h: target.compute_logits(h, float32=False))

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        """The target layers whose inputs an EAGLE-3 head fuses (() otherwise)."""
        head = self.network.head
        return head.config.aux_layer_ids if head is not None and head.is_eagle3 else ()

    @property
    def num_layers(self) -> int:
        return self.network.arch.num_hidden_layers

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        return self.network.arch.kv_bytes_per_token(torch.empty(0, dtype=dtype).element_size())

    def cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        arch = self.network.arch
        return (2, num_blocks, self.block_size, arch.num_key_value_heads, arch.head_dim)

    # ----- one step ------------------------------------------------------------------------

    def propose(
        self,
        plan: StepPlan,
        inputs: StepInputs,
        target: TargetOutputs,
        sampled: torch.Tensor | None,
        sampling_rows: list[tuple[int, int]],
        states: RequestStates,
    ) -> DraftBatch | None:
        """Run the pass over the step's tokens and the chained drafts; None when no request
        drafts. A failure ends speculation for this step only (logged; no drafts)."""
        started = time.perf_counter()
        events = None
        if self.device.type == "cuda":
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        try:
            drafts, request_ids, lengths = self._propose(
                plan, inputs, target, sampled, sampling_rows, states
            )
        except Exception as error:  # noqa: BLE001 -- a drafter never ends a request
            self.num_failures += 1
            if self.num_failures not in (1, 10) and self.num_failures % 1000:
                return None  # logged the first, tenth and every thousandth time
            print(
                f"[ladle] the draft network failed ({self.num_failures} steps so far); those "
                f"steps propose no drafts: "
                f"{type(error).__name__}: {error}",
                file=sys.stderr,
                flush=True,
            )
            return None
        if drafts is None:
            return None
        if events is not None:
            events[1].record()
        return DraftBatch(request_ids, lengths, drafts, time.perf_counter() - started, events)

    def _propose(
        self,
        plan: StepPlan,
        inputs: StepInputs,
        target: TargetOutputs,
        sampled: torch.Tensor | None,
        sampling_rows: list[tuple[int, int]],
        states: RequestStates,
    ) -> tuple[torch.Tensor | None, list[str], list[int]]:
        metadata = dataclasses.replace(inputs.attn_metadata, backend_cache={})
        positions = inputs.positions
        if self.method == "draft_model":
            model = self.network.model
            assert model is not None
            step_hidden = model(target.input_ids, positions, self.kv_caches, metadata)
            step_prenorm = step_hidden
        else:
            next_ids = self._next_token_ids(plan, inputs, target.input_ids, sampled, states)
            head = self.network.head
            assert head is not None
            features = target.features if head.is_eagle3 else target.hidden
            assert features is not None
            step_hidden, step_prenorm = head(
                next_ids, positions, head.combine_features(features), self.kv_caches[0], metadata
            )
        chaining = [
            (position, scheduled)
            for position, scheduled in enumerate(plan.scheduled)
            if scheduled.samples and scheduled.num_lookahead_tokens > 0
        ]
        if sampled is None or not chaining:
            return None, [], []
        return self._chain(
            chaining, inputs, target, sampled, sampling_rows, step_hidden, step_prenorm
        )

    def _next_token_ids(
        self,
        plan: StepPlan,
        inputs: StepInputs,
        input_ids: torch.Tensor,
        sampled: torch.Tensor | None,
        states: RequestStates,
    ) -> torch.Tensor:
        """EAGLE's shifted inputs: per row, the token at the next position (module docstring)."""
        next_ids = torch.roll(input_ids.long(), -1)
        if sampled is not None and sampled.numel():
            next_ids[inputs.logits_indices] = sampled
        # A prompt chunk short of the prompt's end: its last row's next token is the prompt's.
        rows, tokens = [], []
        end = 0
        for scheduled in plan.scheduled:
            end += scheduled.num_tokens
            if not scheduled.samples:
                state = states[scheduled.request_id]
                rows.append(end - 1)
                tokens.append(
                    state.all_token_ids[scheduled.num_computed_before + scheduled.num_tokens]
                )
        if rows:
            next_ids[torch.tensor(rows, device=self.device)] = torch.tensor(
                tokens, dtype=torch.long, device=self.device
            )
        return next_ids

    def _chain(
        self,
        chaining: list,
        inputs: StepInputs,
        target: TargetOutputs,
        sampled: torch.Tensor,
        sampling_rows: list[tuple[int, int]],
        step_hidden: torch.Tensor,
        step_prenorm: torch.Tensor,
    ) -> tuple[torch.Tensor, list[str], list[int]]:
        device = self.device
        first_row_of: dict[int, int] = {}
        for row, (position, offset) in enumerate(sampling_rows):
            if offset == 0:
                first_row_of[position] = row
        num = len(chaining)
        max_drafts = max(len(s.draft_token_ids) for _, s in chaining)
        drafts_host = np.full((num, max(max_drafts, 1)), -1, dtype=np.int64)
        first_rows = np.empty(num, dtype=np.int64)
        plan_positions = np.empty(num, dtype=np.int64)
        lengths = []
        upper_lengths = []
        for index, (position, scheduled) in enumerate(chaining):
            drafts_host[index, : len(scheduled.draft_token_ids)] = scheduled.draft_token_ids
            first_rows[index] = first_row_of[position]
            plan_positions[index] = position
            lengths.append(scheduled.num_lookahead_tokens)
            upper_lengths.append(
                scheduled.num_computed_before + scheduled.num_tokens + lengths[-1]
            )
        packed = torch.from_numpy(
            np.concatenate([drafts_host.reshape(-1), first_rows, plan_positions, lengths])
        ).to(device, non_blocking=True)
        width = drafts_host.shape[1]
        drafts_dev = packed[: num * width].view(num, width)
        first = packed[num * width : num * width + num]
        request_rows = packed[num * width + num : num * width + 2 * num]
        lengths_dev = packed[num * width + 2 * num :]
        # Accepted drafts per request: leading rows whose sampled token equals the next draft.
        offsets = torch.arange(width, device=device)
        row_index = (first[:, None] + offsets).clamp(max=sampled.shape[0] - 1)
        matches = (sampled[row_index] == drafts_dev).long()
        num_accepted = matches.cumprod(1).sum(1)
        last_row = first + num_accepted
        token_row = inputs.logits_indices[last_row]
        new_token = sampled[last_row]
        new_position = inputs.positions[token_row] + 1
        block_tables = inputs.attn_metadata.block_tables[request_rows]
        max_length = max(lengths)
        max_seq_len = max(upper_lengths)
        drafts = torch.empty((num, max_length), dtype=torch.long, device=device)
        if self.method == "draft_model":
            token = new_token
            for step in range(max_length):
                metadata, positions = self._chain_metadata(
                    new_position + step, step, lengths_dev, block_tables, max_seq_len
                )
                hidden = self.network.model(token, positions, self.kv_caches, metadata)
                token = self.network.model.compute_logits(hidden, float32=False).argmax(-1)
                drafts[:, step] = token
            return drafts, [s.request_id for _, s in chaining], lengths
        head = self.network.head
        token = head.draft_ids(step_hidden[token_row])
        feature = step_prenorm[token_row]
        drafts[:, 0] = token
        for step in range(1, max_length):
            # The row at position q + step - 1 takes draft `step` with the previous feature.
            metadata, positions = self._chain_metadata(
                new_position + step - 1, step, lengths_dev, block_tables, max_seq_len
            )
            output, feature = head(token, positions, feature, self.kv_caches[0], metadata)
            token = head.draft_ids(output)
            drafts[:, step] = token
        return drafts, [s.request_id for _, s in chaining], lengths

    def _chain_metadata(
        self,
        positions: torch.Tensor,
        step: int,
        lengths: torch.Tensor,
        block_tables: torch.Tensor,
        max_seq_len: int,
    ) -> tuple[AttentionMetadata, torch.Tensor]:
        """One decode row per drafting request at `positions`. A request that wants fewer
        drafts than `step + 1` has no reserved slot there: its row writes the null block and
        reads its context up to its first chained position (its output is dropped)."""
        num = positions.shape[0]
        block_size = self.block_size
        valid = lengths > step
        first = positions - step
        positions = torch.where(valid, positions, first)
        blocks = block_tables.gather(1, (positions // block_size)[:, None]).squeeze(1)
        slots = torch.where(valid, blocks.long() * block_size + positions % block_size, 0)
        seq_lens = (positions + 1).to(torch.int32)
        if self.device.type == "cpu":
            seq_lens_host = seq_lens.tolist()
            max_seq_len = max(seq_lens_host)
        else:
            seq_lens_host = [max_seq_len] * num  # read for its length only (decode rows)
        metadata = AttentionMetadata(
            slot_mapping=slots,
            query_start_loc=torch.arange(num + 1, dtype=torch.int32, device=self.device),
            seq_lens=seq_lens,
            block_tables=block_tables,
            max_query_len=1,
            max_seq_len=max_seq_len,
            block_size=block_size,
            query_start_loc_host=list(range(num + 1)),
            seq_lens_host=seq_lens_host,
        )
        return metadata, positions
