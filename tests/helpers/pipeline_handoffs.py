"""Two pipeline stages' hand-offs over gloo, driven by hand (test_pipeline_micro_batches.py):
stage 0 launches two steps and only then lets the last stage start, so a hand-off that waited
on the host would stop the test."""

from __future__ import annotations

import os
import time

import torch

from ladle.distributed.process_group import join_ranks, leave
from ladle.worker.shared_samples import SharedSamples


def run_stage(rank: int, rendezvous: str, flag: str, errors) -> None:
    try:
        torch.set_num_threads(1)
        _, stage = join_ranks(rank, 1, 2, rendezvous, torch.device("cpu"))
        steps = {"a": torch.tensor([11, 12]), "b": torch.tensor([21, 22])}
        if stage.is_first:
            last_sampled = torch.zeros(4, dtype=torch.int64)
            pending = SharedSamples(torch.device("cpu"))
            for index, request in enumerate(steps):
                stage.send_forward([torch.full((2, 3), float(index)), torch.ones(2, 3)])
                buffer = torch.empty(2, dtype=torch.int64)
                slots = torch.tensor([2 * index, 2 * index + 1])
                pending.add(frozenset({request}), stage.share_sampled(buffer), buffer, slots)
            # Both steps launched, and the last stage has not started the first.
            open(flag, "w").close()
            pending.apply_before(["b"], last_sampled)  # needs b's ids: waits for a's and b's
            assert last_sampled.tolist() == [11, 12, 21, 22], last_sampled
            assert len(pending) == 0
        else:
            deadline = time.monotonic() + 20
            while not os.path.exists(flag):
                assert time.monotonic() < deadline, "stage 0 waited on the last stage"
                time.sleep(0.01)
            for index, ids in enumerate(steps.values()):
                hidden, residual = stage.receive_forward([(2, 3), (2, 3)], torch.float32,
                                                         torch.device("cpu"))
                assert hidden.eq(float(index)).all() and residual.eq(1.0).all()
                stage.share_sampled(ids.clone()).wait()
        leave()
    except BaseException as error:  # noqa: BLE001 - reported to the test process
        errors.put(f"rank {rank}: {type(error).__name__}: {error}")
        raise
