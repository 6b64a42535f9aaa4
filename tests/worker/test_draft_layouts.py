"""DeviceDrafts keeps a small step's draft shape and index arrays per layout (and slots): the
kept ones must be exactly what a fresh build gives for every step, also when the layouts
repeat with other slots, other sequence positions or steps of another layout in between."""

from __future__ import annotations

import random

import numpy as np
import torch

from ladle.protocol.step import ScheduledRequest, StepPlan
from ladle.worker import drafts_on_device
from ladle.worker.drafts_on_device import DeviceDrafts

# (num_tokens, drafts, samples, moved back): decodes, drafted decodes (device placeholders
# or host drafts), prompt chunks that do and do not sample.
_KINDS = [
    (1, [], True, False),
    (5, [-1] * 4, True, True),
    (5, [-1] * 4, True, False),
    (3, [-1] * 2, True, True),
    (3, [7, 8], True, False),
    (4, [], False, False),
    (4, [], True, False),
]

_ARRAY_FIELDS = ("num_drafts", "drafting", "shifted", "row_positions", "row_offsets", "first_rows")
_HOST_FIELDS = (
    "max_drafts", "any_shifted", "max_device_drafts", "drafting_positions", "first_row_list",
    "sampling_positions",
)  # fmt: skip


def _random_step(rng: random.Random) -> tuple[StepPlan, np.ndarray]:
    num_reqs = rng.randint(1, 4)
    scheduled = []
    for index in range(num_reqs):
        num_tokens, drafts, samples, moved = rng.choice(_KINDS[:3] if index else _KINDS)
        output_index = rng.randint(0, 50) if samples else -1
        scheduled.append(
            ScheduledRequest(
                f"r{index}", num_tokens, rng.randint(10, 200), output_index,
                draft_token_ids=list(drafts), num_unverified_before=4 if moved else 0,
            )
        )  # fmt: skip
    slots = np.array(rng.sample(range(6), num_reqs), dtype=np.int64)
    return StepPlan(scheduled=scheduled), slots


def _layout_arrays(plan: StepPlan) -> tuple[np.ndarray, np.ndarray]:
    """query_start_loc and logits_indices as StepInputBuilder.build makes them."""
    query_start_loc = np.concatenate([[0], np.cumsum([s.num_tokens for s in plan.scheduled])])
    logits_indices = np.array(
        [
            query_start_loc[p + 1] - 1 - (len(plan.scheduled[p].draft_token_ids) - j)
            for p, j in plan.sampling_rows()
        ],
        dtype=np.int64,
    )
    return query_start_loc.astype(np.int64), logits_indices


def _shape_and_parts(drafts: DeviceDrafts, plan: StepPlan, slots: np.ndarray):
    rows = plan.sampling_rows()
    shape = drafts.shape(plan, rows)
    return shape, drafts.extra_parts(shape)(slots, *_layout_arrays(plan))


def test_kept_shapes_and_parts_equal_fresh_ones(monkeypatch):
    rng = random.Random(5)
    steps = [_random_step(rng) for _ in range(300)]
    for kernels in (False, True):
        kept = DeviceDrafts(torch.device("cpu"), 512, 1, 3, kernels=kernels)
        kept_results = [_shape_and_parts(kept, plan, slots) for plan, slots in steps]
        assert len(kept._shapes) < 60  # layouts repeat: most steps were answered from those kept
        with monkeypatch.context() as patch:
            patch.setattr(drafts_on_device, "MAX_REMEMBERED_REQUESTS", 0)
            fresh = DeviceDrafts(torch.device("cpu"), 512, 1, 3, kernels=kernels)
            fresh_results = [_shape_and_parts(fresh, plan, slots) for plan, slots in steps]
            assert not fresh._shapes
        for (plan, _), (kept_shape, kept_parts), (shape, parts) in zip(
            steps, kept_results, fresh_results
        ):
            for field in _ARRAY_FIELDS:
                assert np.array_equal(getattr(kept_shape, field), getattr(shape, field))
            for field in _HOST_FIELDS:
                assert getattr(kept_shape, field) == getattr(shape, field)
            if shape.drafting_positions:
                assert kept._ngram_width(plan, kept_shape) == fresh._ngram_width(plan, shape)
            assert kept_parts.keys() == parts.keys()
            for name in parts:
                assert np.array_equal(kept_parts[name], parts[name]), name
