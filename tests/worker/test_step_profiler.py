"""The environment-switched step profiler (worker/step_profiler.py): the window it profiles is
the one asked for, its summary is written per rank, and a malformed window is a clear error."""

from __future__ import annotations

import json

import pytest
import torch

from ladle import LLM, SamplingParams
from ladle.worker.step_profiler import StepProfiler


def test_a_malformed_window_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("LADLE_TORCH_PROFILER_DIR", str(tmp_path))
    monkeypatch.setenv("LADLE_PROFILE_STEPS", "ten")
    with pytest.raises(ValueError, match="LADLE_PROFILE_STEPS"):
        StepProfiler.from_env(0, torch.device("cpu"))
    monkeypatch.delenv("LADLE_TORCH_PROFILER_DIR")
    assert StepProfiler.from_env(0, torch.device("cpu")) is None


def test_the_window_profiles_the_steps_asked_for(monkeypatch, tmp_path):
    monkeypatch.setenv("LADLE_TORCH_PROFILER_DIR", str(tmp_path))
    monkeypatch.setenv("LADLE_PROFILE_STEPS", "2:3")
    llm = LLM("tiny-llama", load_format="dummy", max_num_seqs=4)
    steps = llm.engine.executor.worker.step_profiler
    llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=12, ignore_eos=True),
                 use_tqdm=False)  # fmt: skip
    summary = json.loads((tmp_path / "rank0.json").read_text())
    assert summary["steps"] == 3
    assert summary["wall_ms_per_step"] > 0
    assert (tmp_path / "rank0.trace.json").stat().st_size > 0
    assert steps.steps >= 2 + 3


def test_each_rank_reports_its_time_in_collectives(monkeypatch):
    """Two tensor-parallel ranks over gloo: `ladle bench --profile-ranks`' folder holds both
    ranks' summaries, each with time in the c10d collectives (every layer all-reduces) that
    is part of, and less than, the step's wall time."""
    from ladle.bench import rank_profiles
    from ladle.worker.step_profiler import DIRECTORY_ENV, WINDOW_ENV

    monkeypatch.setenv(DIRECTORY_ENV, "")  # restored (unset) after the test
    monkeypatch.setenv(WINDOW_ENV, "")
    directory = rank_profiles.switch_on("3:5")
    llm = LLM("tiny-llama", load_format="dummy", max_num_seqs=4, tensor_parallel_size=2)
    try:
        llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=16,
                     ignore_eos=True), use_tqdm=False)  # fmt: skip
    finally:
        llm.engine.executor.shutdown()
    summaries = rank_profiles.read(directory, 2)
    assert all(summary is not None for summary in summaries)
    for summary in summaries:
        assert 0 < summary["collective_ms_per_step"] < summary["wall_ms_per_step"]
    rows = dict(rank_profiles.table_rows(summaries))
    assert "rank 1 step wall/busy/collectives (ms)" in rows


def test_the_python_profile_covers_the_same_window(monkeypatch, tmp_path):
    """LADLE_PROFILE_PYTHON=1: the window's cProfile names the step's own Python functions (the
    scheduler's schedule runs once a step) with their per-step counts; no torch profile runs in
    that window."""
    monkeypatch.setenv("LADLE_TORCH_PROFILER_DIR", str(tmp_path))
    monkeypatch.setenv("LADLE_PROFILE_STEPS", "2:4")
    monkeypatch.setenv("LADLE_PROFILE_PYTHON", "1")
    llm = LLM("tiny-llama", load_format="dummy", max_num_seqs=4)
    llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=12, ignore_eos=True),
                 use_tqdm=False)  # fmt: skip
    import pstats

    stats = pstats.Stats(str(tmp_path / "rank0.pstats"))
    schedules = [calls for (file, _, name), (_, calls, *_) in stats.stats.items()
                 if name == "schedule" and file.endswith("scheduler.py")]  # fmt: skip
    assert schedules == [4]
    text = (tmp_path / "rank0.python.txt").read_text().splitlines()
    assert text[0].startswith("4 steps")
    assert len(text) > 10
    assert not (tmp_path / "rank0.trace.json").exists()
