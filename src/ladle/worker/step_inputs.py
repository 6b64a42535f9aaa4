"""Turn one StepPlan into device tensors: the one place a batch becomes tensors.

All integer metadata of the step (token ids, positions, cache slots, query offsets, sequence
lengths, new block-table entries, which rows to sample, each sampling row's step counter) and the
sampling rows of requests new to the batch (float32 values stored bit for bit as int32) are laid
into ONE pinned int32 host buffer and moved with ONE non-blocking copy; the device tensors are
views into it. The parts that the device uses as int64 (positions, cache slots, and every index
of a gather or scatter) travel as int64, each value as a pair of int32 words at the front of the
buffer, and are viewed back as int64: a `.long()` of each on the device would be one more
kernel launch per part and step, and at batch 1 the step is bound by its launches.

Block tables and sampling rows live in the persistent batch (persistent_batch.py): only what the
scheduler changed is shipped, and the step's rows are gathered on the device.

A decode step that a captured graph replays (DecodeGraphs.decode_batch_size) also writes the
graph's own inputs: the positions, cache slots and context lengths of the padded bucket travel
as one more host-to-device copy straight into the graph's static buffer (cuda_graphs.py,
pack_decode_words), and the block-table rows are gathered into the graph's table. Otherwise the
replay would copy each of them there again (three device-to-device copies, a table copy and
two fills for the padding rows, each a launch of the host's).
Numpy builds the per-token arrays so the host cost grows with the number of requests, not with
Python work per token.

With overlapped scheduling a decode row's last token may not be on the host yet (the step that
samples it is still running): its input id is shipped as -1 with the row's slot in the
persistent batch, and the runner reads the token from the slot's device copy instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ladle.attention.metadata import AttentionMetadata
from ladle.protocol.step import StepPlan
from ladle.sample.metadata import ROW_DTYPES, pack_sampling_rows, unpack_sampling_columns
from ladle.worker.cuda_graphs import DecodeGraphs, pack_decode_words
from ladle.worker.persistent_batch import PersistentBatch
from ladle.worker.request_states import RequestStates
from ladle.worker.step_events import record_event

# The parts shipped as int64 (see the module docstring); the others go as int32.
_INT64_PARTS = frozenset(
    {
        "positions",
        "slot_mapping",
        "block_update_indices",
        "request_slots",
        "new_row_slots",
        "logits_indices",
        "sampling_slots",
        "token_slots",
    }
)


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] int32
    positions: torch.Tensor  # [num_tokens] int64
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampling_reqs] int64: rows of the hidden states to sample
    sampling_rows: dict[str, torch.Tensor]  # [num_sampling_reqs] each, on the device
    # [num_tokens] int64 slot of each token's request when some input id is -1 (read from the
    # device), else None.
    token_slots: torch.Tensor | None
    sampling_slots: torch.Tensor  # [num_sampling_reqs] int64 slot of each sampling request
    # Every input id is -1: each token is still on the device or is a draft the device fills
    # in after (drafts_on_device.py). The ids are then the gather at token_slots alone, no
    # merge with the shipped ones (a drafted batch-1 step in flight: two launches fewer; the
    # drafts' rows read their slot's last token, as the merge gave them, until filled in).
    reads_only_device_ids: bool = False
    # A decode step whose graph inputs (but the ids) are in the graph's static buffers already.
    graph_inputs_written: bool = False
    # [num_reqs] int64 slot of each request, on the device.
    request_slots: torch.Tensor | None = None
    # The extra parts a caller shipped with the step (build's extra_parts), on the device.
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


# build's extra_parts: (slots, query_start_loc, logits_indices) -> more int64 parts to ship.
ExtraParts = Callable[[np.ndarray, np.ndarray, np.ndarray], dict[str, np.ndarray]]


class StepInputBuilder:
    """Keeps two pinned staging buffers, used in turn, that grow to the largest step seen:
    while one step's copy may still be queued on the device, the next step fills the other.
    Each is copied into a device buffer of its own, so a step's device tensors stay valid
    until the step after next is built (nothing reads them later)."""

    def __init__(self, device: torch.device, block_size: int) -> None:
        self.device = device
        self._on_cpu = device.type == "cpu"  # asked twice a step; torch.device's type is slow
        self.block_size = block_size
        self._staging = [torch.empty(0, dtype=torch.int32) for _ in range(2)]
        self._staging_host = [staging.numpy() for staging in self._staging]  # the same memory
        # The last copy out of each staging buffer: the host waits for it before refilling.
        self._copy_done: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        # The device buffer each staging buffer is copied into (CUDA; on the CPU the staging
        # buffer itself is used), and the views last cut from it: ((names, sizes), views).
        self._device_buffers = [torch.empty(0, dtype=torch.int32, device=device) for _ in range(2)]
        # Per turn, bounded (remember_bounded): (names, sizes) of a layout -> its views, and
        # number of sampling rows -> (gathered columns, their views). Steps with drafts vary
        # both.
        self._views: list[dict[tuple, dict[str, torch.Tensor]]] = [{}, {}]
        self._sampling_gathers: list[dict[int, tuple[torch.Tensor, dict]]] = [{}, {}]
        # (num_reqs, max_blocks) -> (the graph's table, its rows, their columns): _graph_tables.
        self._graph_table_views: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}

    def build(
        self,
        plan: StepPlan,
        states: RequestStates,
        sampling_rows: list[tuple[int, int]],
        sampling_steps: list[int],
        batch: PersistentBatch,
        graphs: DecodeGraphs | None = None,
        extra_parts: ExtraParts | None = None,
    ) -> StepInputs:
        """The step's device tensors. A step has at least one request (EngineCore.step returns
        early otherwise), and every scheduled request holds at least one block.

        sampling_rows: (position of the request in the plan, drafts before the row) per row
        that samples (StepPlan.sampling_rows); sampling_steps: each row's output index.
        graphs: the captured decode graphs (None: eager, the CPU); a decode step one replays
        gets its graph inputs written here (the module docstring). extra_parts: more int64
        parts of the caller's, shipped in the same copy (StepInputs.extra; their names must
        start with "extra_")."""
        scheduled = plan.scheduled
        request_ids = [s.request_id for s in scheduled]
        slots, new_positions = batch.slots_for(request_ids)
        new_rows = None
        if new_positions:  # a step of running requests only packs nothing
            new_states = [states[request_ids[i]] for i in new_positions]
            new_rows = pack_sampling_rows(
                [state.sampling_params for state in new_states],
                [state.sampling_seed for state in new_states],
                [0] * len(new_positions),
            )
        update_indices, update_block_ids = batch.update_block_tables(
            slots, [s.new_blocks for s in scheduled]
        )
        num_reqs = len(scheduled)
        query_lens_host = [s.num_tokens for s in scheduled]
        num_tokens = sum(query_lens_host)
        computed = np.array([s.num_computed_before for s in scheduled], dtype=np.int64)
        if num_tokens == num_reqs:
            # A decode step (one token a request, no drafts): each token is its request's
            # next position, and the general layout below reduces to this (at batch 1 the host
            # time of a step is per call, so the calls that would compute it are skipped).
            query_start_loc = np.arange(num_reqs + 1, dtype=np.int64)
            positions = computed
            seq_lens = computed + 1
            token_requests_slots = slots
            max_query_len = 1
        else:
            query_lens = np.array(query_lens_host, dtype=np.int64)
            query_start_loc = np.zeros(num_reqs + 1, dtype=np.int64)
            np.cumsum(query_lens, out=query_start_loc[1:])
            seq_lens = computed + query_lens
            # Each token's position: its request's first new position plus its offset in the
            # chunk.
            request_of_token = np.repeat(np.arange(num_reqs), query_lens)
            offsets = np.arange(num_tokens) - query_start_loc[:-1][request_of_token]
            positions = computed[request_of_token] + offsets
            token_requests_slots = slots[request_of_token]
            max_query_len = max(query_lens_host)

        chunks = []
        num_device_ids = 0
        num_device_drafts = 0
        for request_id, request, c in zip(request_ids, scheduled, computed.tolist()):
            drafts = request.draft_token_ids
            n = request.num_tokens - len(drafts)
            chunk = states[request_id].all_token_ids[c : c + n]
            if len(chunk) < n:  # the last token is still being sampled on the device
                num_device_ids += n - len(chunk)
                chunk = chunk + [-1] * (n - len(chunk))
            if drafts:
                if drafts[0] < 0:  # placeholders the device drafter fills in (all -1)
                    num_device_drafts += len(drafts)
                chunks.append(chunk + drafts)
            else:
                chunks.append(chunk)
        input_ids = np.fromiter(
            itertools.chain.from_iterable(chunks), dtype=np.int64, count=num_tokens
        )

        max_blocks = batch.max_num_blocks(slots)
        block_size = self.block_size
        block_of_token = batch.block_table_host[token_requests_slots, positions // block_size]
        slot_mapping = block_of_token.astype(np.int64) * block_size + positions % block_size
        row_positions = np.array([position for position, _ in sampling_rows], dtype=np.int64)
        if num_tokens == num_reqs:
            logits_indices = row_positions  # each request's one token
        else:
            # A row with j drafts before it reads the hidden state of the chunk's token that
            # the last of those j drafts (or, for j = 0, the last known token) occupies.
            rows_after = np.array(
                [len(scheduled[p].draft_token_ids) - j for p, j in sampling_rows], dtype=np.int64
            )
            logits_indices = query_start_loc[1:][row_positions] - 1 - rows_after

        int_parts = {
            "input_ids": input_ids,
            "positions": positions,
            "slot_mapping": slot_mapping,
            "query_start_loc": query_start_loc,
            "seq_lens": seq_lens,
            "block_update_indices": update_indices,
            "block_update_ids": update_block_ids,
            "request_slots": slots,
            "sampling_steps": np.asarray(sampling_steps, dtype=np.int64),
            "logits_indices": logits_indices,
            "sampling_slots": slots[row_positions],
        }
        if new_positions:
            int_parts["new_row_slots"] = slots[new_positions]
            int_parts["new_rows"] = new_rows.numpy().reshape(-1)
        if num_device_ids:
            int_parts["token_slots"] = token_requests_slots
        extra_names: list[str] = []
        if extra_parts is not None:
            extra = extra_parts(slots, query_start_loc, logits_indices)
            int_parts.update(extra)
            extra_names = list(extra)
        graph_batch = None
        if graphs is not None:
            graph_batch = graphs.decode_batch_size(num_reqs, num_tokens, max_query_len, max_blocks)
        graph_words = None
        if graph_batch is not None:
            assert graphs is not None and graphs.static is not None
            max_bs = graphs.static.input_ids.shape[0]
            words = pack_decode_words(max_bs, positions, slot_mapping, seq_lens)
            graph_words = (words, graphs.static.words)
        device_views = self._ship(int_parts, graph_words)
        if new_positions:
            batch.write_sampling_rows(
                device_views["new_row_slots"], device_views["new_rows"].view(new_rows.shape)
            )
        sampling_rows = self._gather_sampling_rows(batch, device_views["sampling_slots"])
        sampling_rows["step"] = device_views["sampling_steps"]
        batch.apply_block_updates(
            device_views["block_update_indices"], device_views["block_update_ids"]
        )
        if graph_batch is not None:
            assert graphs is not None and graphs.static is not None
            # Whole rows (the graph's table is as wide as the batch's), straight into the
            # graph's buffer: one launch, no copy at the replay.
            graph_rows, block_tables = self._graph_tables(
                graphs.static.block_tables, num_reqs, max_blocks
            )
            torch.index_select(batch.block_table, 0, device_views["request_slots"], out=graph_rows)
        else:
            block_tables = batch.block_table[device_views["request_slots"], :max_blocks]

        seq_lens_host = seq_lens.tolist()
        attn_metadata = AttentionMetadata(
            slot_mapping=device_views["slot_mapping"],
            query_start_loc=device_views["query_start_loc"],
            seq_lens=device_views["seq_lens"],
            block_tables=block_tables,
            max_query_len=max_query_len,
            max_seq_len=max(seq_lens_host),
            block_size=self.block_size,
            query_start_loc_host=query_start_loc.tolist(),
            seq_lens_host=seq_lens_host,
        )
        return StepInputs(
            input_ids=device_views["input_ids"],
            positions=device_views["positions"],
            attn_metadata=attn_metadata,
            logits_indices=device_views["logits_indices"],
            sampling_rows=sampling_rows,
            token_slots=device_views.get("token_slots"),
            sampling_slots=device_views["sampling_slots"],
            reads_only_device_ids=bool(num_device_ids)
            and num_device_ids + num_device_drafts == num_tokens,
            graph_inputs_written=graph_batch is not None,
            request_slots=device_views["request_slots"],
            extra=(
                {name: device_views[name] for name in extra_names} if extra_names else _NO_EXTRA
            ),
        )

    def _graph_tables(
        self, static_tables: torch.Tensor, num_reqs: int, max_blocks: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The graph's table rows of a step of num_reqs requests, and their first max_blocks
        columns (the step's block tables): two views, kept per shape (a decode batch asks for
        the same ones until a request's table grows)."""
        key = (num_reqs, max_blocks)
        kept = self._graph_table_views.get(key)
        if kept is None or kept[0] is not static_tables:  # a new capture: new buffers
            rows = static_tables[:num_reqs]
            kept = (static_tables, rows, rows[:, :max_blocks])
            remember_bounded(self._graph_table_views, key, kept)
        return kept[1], kept[2]

    def _gather_sampling_rows(
        self, batch: PersistentBatch, slots: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The sampling rows of the step's slots, gathered from the persistent batch (one
        launch) into a buffer of the step's turn that is kept while the number of rows stays
        the same, with its per-value views (unpack_sampling_columns: 18 calls to cut)."""
        turn = 1 - self._turn  # the turn _ship took
        num_rows = slots.shape[0]
        gathered = self._sampling_gathers[turn].get(num_rows)
        if gathered is None:
            columns = torch.empty(
                (len(ROW_DTYPES), num_rows), dtype=torch.int32, device=self.device
            )
            gathered = (columns, unpack_sampling_columns(columns))
            remember_bounded(self._sampling_gathers[turn], num_rows, gathered)
        batch.gather_sampling_columns(slots, out=gathered[0])
        return dict(gathered[1])

    def _ship(
        self,
        int_parts: dict[str, np.ndarray],
        graph_words: tuple[np.ndarray, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Pack every part into one int32 buffer, copy it once, and return views per part: the
        _INT64_PARTS first, as int32 pairs, so each starts at an even offset and views back as
        int64 (viewing 4-byte words as 8-byte ones needs an even offset and length).
        graph_words: (host words, the graph's static words buffer): staged after the parts and
        copied into that buffer with one more copy.

        The views are kept per staging turn and layout (the parts' names and sizes): a
        decode batch ships the same few layouts step after step, and at batch 1 a step's host time
        is mostly per-call overhead (torch's split and view calls cost more than the copy).
        The returned dict is shared with later steps of the same turn and layout: read only."""
        names = tuple(int_parts)
        sizes = tuple([part.size for part in int_parts.values()])
        wide_names, narrow_names = _split_names(names)
        wide = [int_parts[name] for name in wide_names]
        narrow = [int_parts[name] for name in narrow_names]
        num_wide_words = 2 * sum(part.size for part in wide)
        total = num_wide_words + sum(part.size for part in narrow)
        num_graph_words = 0 if graph_words is None else graph_words[0].size
        turn = self._turn
        self._turn = 1 - turn
        copy_done = self._copy_done[turn]
        if copy_done is not None:
            copy_done.synchronize()  # the copy out of this staging buffer two steps ago
        staging = self._staging[turn]
        if staging.numel() < total + num_graph_words:
            staging = self._staging[turn] = torch.empty(
                max(total + num_graph_words, 2 * staging.numel()),
                dtype=torch.int32,
                pin_memory=not self._on_cpu,
            )
            self._staging_host[turn] = staging.numpy()
            self._views[turn] = {}
        # Two casting concatenates straight into the staging buffer: the wide parts through an
        # int64 view of its front, the narrow ones (int64 on the host) narrowed as they land.
        host = self._staging_host[turn]
        if wide:
            np.concatenate(wide, out=host[:num_wide_words].view(np.int64), casting="unsafe")
        if narrow:
            np.concatenate(narrow, out=host[num_wide_words:total], casting="unsafe")
        if self._on_cpu:
            on_device = staging  # already where it is used
        else:
            on_device = self._device_buffers[turn]
            if on_device.numel() < total:
                on_device = self._device_buffers[turn] = torch.empty(
                    staging.numel(), dtype=torch.int32, device=self.device
                )
                self._views[turn] = {}
            on_device[:total].copy_(staging[:total], non_blocking=True)
        if graph_words is not None:
            host[total : total + num_graph_words] = graph_words[0]
            graph_words[1].copy_(staging[total : total + num_graph_words], non_blocking=True)
        if not self._on_cpu:
            # One event per staging buffer, recorded again each time (waited for above).
            if copy_done is None:
                copy_done = self._copy_done[turn] = torch.cuda.Event()
            record_event(copy_done, self.device)
        views = self._views[turn].get((names, sizes))
        if views is None:
            views = _split_views(on_device, names, sizes, num_wide_words)
            remember_bounded(self._views[turn], (names, sizes), views)
        return views


_MAX_REMEMBERED = 64


# A step without extra parts shares this (read only).
_NO_EXTRA: dict[str, torch.Tensor] = {}

# Part names (a layout) -> (the int64 ones, the int32 ones); a batch ships a few layouts.
_SPLITS: dict[tuple[str, ...], tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _split_names(names: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The parts that travel as int64 (the _INT64_PARTS and every caller's extra part), and
    the others, in their order."""
    split = _SPLITS.get(names)
    if split is None:
        wide = tuple(n for n in names if n in _INT64_PARTS or n.startswith("extra_"))
        narrow = tuple(n for n in names if n not in wide)
        split = (wide, narrow)
        remember_bounded(_SPLITS, names, split)
    return split


def remember_bounded(cache: dict, key, value) -> None:
    """cache[key] = value, the cache emptied first once it holds _MAX_REMEMBERED entries (a
    steady batch uses a few; bursts of varied layouts must not grow it without bound)."""
    if len(cache) >= _MAX_REMEMBERED:
        cache.clear()
    cache[key] = value


def _split_views(
    buffer: torch.Tensor, names: tuple[str, ...], sizes: tuple[int, ...], num_wide_words: int
) -> dict[str, torch.Tensor]:
    """Each part's view into the shipped buffer (layout: StepInputBuilder._ship)."""
    wide_names, narrow_names = _split_names(names)
    size_of = dict(zip(names, sizes, strict=True))
    wide_views = torch.split(
        buffer[:num_wide_words].view(torch.int64), [size_of[name] for name in wide_names]
    )
    narrow_sizes = [size_of[name] for name in narrow_names]
    narrow_views = torch.split(
        buffer[num_wide_words : num_wide_words + sum(narrow_sizes)], narrow_sizes
    )
    return dict(zip(wide_names + narrow_names, wide_views + narrow_views, strict=True))
