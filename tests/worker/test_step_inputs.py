"""StepInputBuilder against a plain-Python reference of a step's layout, token by token.

The builder takes shortcuts on the host (a decode step's layout without the general arithmetic,
views into its shipped buffer cut once per layout and reused by later steps of that layout);
each step here is checked against the per-token definition, over steps whose layouts repeat
(so the reused views must show the new step's values) and steps that take the general path
(prompt chunks, drafts) between them.
"""

from __future__ import annotations

import numpy as np
import torch

from ladle.protocol.step import BlockUpdate, NewRequest, ScheduledRequest, StepPlan
from ladle.sampling.params import SamplingParams
from ladle.worker.cuda_graphs import decode_words_layout, pack_decode_words
from ladle.worker.persistent_batch import PersistentBatch
from ladle.worker.request_states import RequestStates
from ladle.worker.step_inputs import StepInputBuilder

BLOCK_SIZE = 4


def _reference(plan: StepPlan, states: RequestStates, tables: dict[str, list[int]]) -> dict:
    """The step's layout from the definitions, one token at a time."""
    input_ids, positions, slot_mapping, query_start_loc, seq_lens = [], [], [], [0], []
    for scheduled in plan.scheduled:
        known = states[scheduled.request_id].all_token_ids
        start = scheduled.num_computed_before
        num_known = scheduled.num_tokens - len(scheduled.draft_token_ids)
        for offset in range(scheduled.num_tokens):
            position = start + offset
            if offset < num_known:
                input_ids.append(known[position] if position < len(known) else -1)
            else:
                input_ids.append(scheduled.draft_token_ids[offset - num_known])
            positions.append(position)
            block = tables[scheduled.request_id][position // BLOCK_SIZE]
            slot_mapping.append(block * BLOCK_SIZE + position % BLOCK_SIZE)
        query_start_loc.append(query_start_loc[-1] + scheduled.num_tokens)
        seq_lens.append(start + scheduled.num_tokens)
    logits_indices = [
        query_start_loc[position + 1] - 1 - (len(plan.scheduled[position].draft_token_ids) - j)
        for position, j in plan.sampling_rows()
    ]
    return {
        "input_ids": input_ids,
        "positions": positions,
        "slot_mapping": slot_mapping,
        "query_start_loc": query_start_loc,
        "seq_lens": seq_lens,
        "logits_indices": logits_indices,
    }


def _check_step(builder, batch, states, tables, plan: StepPlan):
    for scheduled in plan.scheduled:
        if scheduled.new_blocks is not None:
            table = tables.setdefault(scheduled.request_id, [])
            del table[scheduled.new_blocks.start :]
            table.extend(scheduled.new_blocks.block_ids)
    states.add(plan.new_requests)
    rows = plan.sampling_rows()
    steps = [plan.scheduled[p].output_index + j for p, j in rows]
    inputs = builder.build(plan, states, rows, steps, batch)
    expected = _reference(plan, states, tables)
    shipped_ids = inputs.input_ids.tolist()
    if inputs.token_slots is not None:  # ids still on the device read as -1 here
        assert inputs.token_slots.tolist() == [
            batch._slot_of[s.request_id] for s in plan.scheduled for _ in range(s.num_tokens)
        ]
    assert shipped_ids == expected["input_ids"]
    assert inputs.reads_only_device_ids == all(i < 0 for i in expected["input_ids"])
    assert inputs.positions.tolist() == expected["positions"]
    metadata = inputs.attn_metadata
    assert metadata.slot_mapping.tolist() == expected["slot_mapping"]
    assert metadata.query_start_loc.tolist() == expected["query_start_loc"]
    assert metadata.query_start_loc_host == expected["query_start_loc"]
    assert metadata.seq_lens.tolist() == expected["seq_lens"] == metadata.seq_lens_host
    assert metadata.max_seq_len == max(expected["seq_lens"])
    assert metadata.max_query_len == max(s.num_tokens for s in plan.scheduled)
    # Each row starts with its request's blocks (past them a reused slot may hold an earlier
    # request's ids: no token of this step reads there).
    widest = max(len(tables[s.request_id]) for s in plan.scheduled)
    assert metadata.block_tables.shape == (len(plan.scheduled), widest)
    for row, scheduled in zip(metadata.block_tables.tolist(), plan.scheduled):
        assert row[: len(tables[scheduled.request_id])] == tables[scheduled.request_id]
    assert inputs.logits_indices.tolist() == expected["logits_indices"]
    assert inputs.sampling_rows["step"].tolist() == steps
    temperatures = [
        states[plan.scheduled[p].request_id].sampling_params.temperature for p, _ in rows
    ]
    expected_temperatures = torch.tensor(temperatures, dtype=torch.float32)
    assert torch.equal(inputs.sampling_rows["temperature"], expected_temperatures)
    return inputs


def test_steps_match_the_per_token_reference():
    builder = StepInputBuilder(torch.device("cpu"), BLOCK_SIZE)
    batch = PersistentBatch(max_blocks_per_seq=8, device=torch.device("cpu"), initial_slots=4)
    states = RequestStates()
    tables: dict[str, list[int]] = {}
    prompts = {"a": [11, 12, 13, 14, 15], "b": [21, 22, 23]}
    new = [
        NewRequest(name, prompt, SamplingParams(temperature=t), 7, [0])
        for (name, prompt), t in zip(prompts.items(), (0.0, 0.5))
    ]

    def check(plan: StepPlan) -> None:
        _check_step(builder, batch, states, tables, plan)

    # A prompt chunk of "a" (no sample) and the whole prompt of "b".
    check(
        StepPlan(
            scheduled=[
                ScheduledRequest("a", 4, 0, -1, BlockUpdate(0, [3])),
                ScheduledRequest("b", 3, 0, 0, BlockUpdate(0, [5])),
            ],
            new_requests=new,
        ),
    )
    # "a" ends its prompt (a one-token chunk that samples) while "b" decodes: decode layout.
    states.append_tokens("b", [24])
    check(
        StepPlan(
            scheduled=[
                ScheduledRequest("a", 1, 4, 0, BlockUpdate(1, [6])),
                ScheduledRequest("b", 1, 3, 1, BlockUpdate(1, [7])),
            ]
        ),
    )
    # Decode steps of one layout, the last ids still on the device (read as -1): the third
    # reuses the views the first cut (the second the views of the step before); the last
    # gives "a" a block.
    for step in range(4):
        new_block = BlockUpdate(2, [8]) if step == 3 else None
        check(
            StepPlan(
                scheduled=[
                    ScheduledRequest("a", 1, 5 + step, 1 + step, new_block),
                    ScheduledRequest("b", 1, 4 + step, 2 + step),
                ]
            ),
        )
        states.append_tokens("a", [40 + step])
        states.append_tokens("b", [50 + step])
    # "b" verifies two drafts (three sampling rows), "a" decodes: the general layout again.
    check(
        StepPlan(
            scheduled=[
                ScheduledRequest("a", 1, 9, 5),
                ScheduledRequest("b", 3, 8, 6, BlockUpdate(2, [9]), draft_token_ids=[61, 62]),
            ]
        ),
    )
    # Back to a decode layout seen before, with "b" alone (a new layout) and then both.
    states.append_tokens("a", [41])
    states.append_tokens("b", [61, 62, 63])
    check(
        StepPlan(
            scheduled=[
                ScheduledRequest("b", 1, 11, 9),
            ]
        ),
    )
    check(
        StepPlan(
            scheduled=[
                ScheduledRequest("a", 1, 10, 6),
                ScheduledRequest("b", 1, 11, 9),
            ]
        ),
    )
    # "a" ends; a new request under the same id takes a slot with its own sampling row, in a
    # step of the same ids as the last one.
    batch.release(["a"])
    states.forget(["a"])
    renewed = NewRequest("a", [71, 72], SamplingParams(temperature=0.9), 3, [0])
    states.append_tokens("b", [64])
    check(
        StepPlan(
            scheduled=[
                ScheduledRequest("a", 2, 0, 0, BlockUpdate(0, [10])),
                ScheduledRequest("b", 1, 12, 10, BlockUpdate(3, [11])),
            ],
            new_requests=[renewed],
        ),
    )


def test_device_draft_placeholders_are_read_on_the_device():
    """Drafts the device fills in (-1 placeholders, core/drafts_in_flight.py) behind a last
    token still on the device: every id is read on the device, no merge with the shipped ones;
    behind a known last token (or beside a request whose ids the host knows) the ids merge."""
    builder = StepInputBuilder(torch.device("cpu"), BLOCK_SIZE)
    batch = PersistentBatch(max_blocks_per_seq=8, device=torch.device("cpu"), initial_slots=4)
    states = RequestStates()
    tables: dict[str, list[int]] = {}
    new = [
        NewRequest(name, prompt, SamplingParams(temperature=0.0), 7, [0])
        for name, prompt in (("a", [11, 12, 13]), ("b", [21, 22]))
    ]

    def check(plan: StepPlan, reads_only: bool) -> None:
        inputs = _check_step(builder, batch, states, tables, plan)
        assert inputs.reads_only_device_ids == reads_only

    check(
        StepPlan(
            scheduled=[
                ScheduledRequest("a", 3, 0, 0, BlockUpdate(0, [3])),
                ScheduledRequest("b", 2, 0, 0, BlockUpdate(0, [4])),
            ],
            new_requests=new,
        ),
        reads_only=False,
    )
    # "a"'s sampled token is on the device; two drafts to fill in after it.
    drafted = ScheduledRequest("a", 3, 3, 1, BlockUpdate(0, [3, 5]), draft_token_ids=[-1, -1])
    check(StepPlan(scheduled=[drafted]), reads_only=True)
    # Beside "b", whose last token the host knows.
    states.append_tokens("b", [23])
    check(StepPlan(scheduled=[drafted, ScheduledRequest("b", 1, 2, 1)]), reads_only=False)
    # "a"'s token known: only the drafts are -1.
    states.append_tokens("a", [14])
    check(StepPlan(scheduled=[drafted]), reads_only=False)


def test_decode_words_follow_their_layout():
    """pack_decode_words writes each part where decode_words_layout (the graph's views) reads
    it, the padding rows at slot 0 with a context of one."""
    max_bs = 4
    words = pack_decode_words(
        max_bs,
        np.array([7, 2**40 + 3], dtype=np.int64),
        np.array([17, 2**33], dtype=np.int64),
        np.array([8, 9], dtype=np.int64),
    )
    layout = decode_words_layout(max_bs)
    start, count = layout["positions"]
    assert words[start : start + count].view(np.int64).tolist() == [7, 2**40 + 3, 0, 0]
    start, count = layout["slot_mapping"]
    assert words[start : start + count].view(np.int64).tolist() == [17, 2**33, 0, 0]
    start, count = layout["seq_lens"]
    assert words[start : start + count].tolist() == [8, 9, 1, 1]
