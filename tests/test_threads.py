"""The CPU thread settings (ladle/threads.py): waiting OpenMP threads sleep, and the engine's
team shrinks to the cores other programs leave free and grows back when they go."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from ladle import threads


def test_import_ladle_sets_passive_waiting_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if k != threads.WAIT_POLICY_ENV}
    code = "import ladle, os, sys; print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["PASSIVE", "False"]
    # A user's own choice wins.
    env[threads.WAIT_POLICY_ENV] = "ACTIVE"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.split()[0] == "ACTIVE"


@pytest.fixture()
def restore_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_governor_follows_the_free_cores(monkeypatch, restore_torch_threads):
    machine = {"runnable": 1}
    clock = {"now": 100.0}
    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    monkeypatch.setattr(threads, "runnable_threads", lambda: machine["runnable"])
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock["now"])
    monkeypatch.setenv(threads.WAIT_POLICY_ENV, "PASSIVE")
    governor = threads.ThreadGovernor(max_threads=4)
    assert governor.enabled and torch.get_num_threads() == 4

    def settle(runnable: int) -> int:
        machine["runnable"] = runnable
        for _ in range(8):  # the competitor count is smoothed over a few looks
            clock["now"] += threads.CHECK_INTERVAL_S
            governor.maybe_adjust()
        return torch.get_num_threads()

    assert settle(1) == 4  # only our own thread runs: all cores
    assert settle(3) == 2  # two other programs busy: two cores left
    assert settle(9) == 1  # more competitors than cores: never below one thread
    assert settle(1) == 4  # they are gone: back to all cores
    # Between looks it does nothing, however often it is called.
    machine["runnable"] = 9
    governor.maybe_adjust()
    assert torch.get_num_threads() == 4


def test_governor_counts_its_own_spinning_workers(monkeypatch, restore_torch_threads):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "runnable_threads", lambda: 2)  # our 2 threads, one spinning
    clock = {"now": 100.0}
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock["now"])
    monkeypatch.setenv(threads.WAIT_POLICY_ENV, "ACTIVE")
    governor = threads.ThreadGovernor(max_threads=2)
    for _ in range(8):
        clock["now"] += threads.CHECK_INTERVAL_S
        governor.maybe_adjust()
    assert torch.get_num_threads() == 2
