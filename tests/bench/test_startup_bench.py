"""`ladle bench startup`: a fresh process per run, timed from its spawn to the first token.

The real runs use the tiny-llama preset on the CPU (a few seconds each, most of it imports): the
reported time must cover the child's own measured start-up, and the first token must be the one
LLM.generate gives in this process for the same prompt and weights.
"""

from __future__ import annotations

import pytest

from ladle.bench import startup as startup_bench
from ladle.bench.startup import PROMPT_TOKEN_IDS, measure_startup, summarize
from ladle.bench.startup_runs import StartupRun
from ladle.startup_phases import (
    StartupClock,
    describe_startup_phases,
    parse_startup_phases,
)

FLAGS = ["--load-format", "dummy", "--max-model-len", "256"]


@pytest.fixture(scope="module")
def in_process_output():
    from ladle import LLM, SamplingParams

    llm = LLM("tiny-llama", load_format="dummy", max_model_len=256)
    outputs = llm.generate(
        [{"prompt_token_ids": PROMPT_TOKEN_IDS}],
        SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
        use_tqdm=False,
    )
    return outputs[0].outputs[0]


def test_offline_run_times_the_whole_start_up_and_gives_the_in_process_token(in_process_output):
    runs, unreported = measure_startup("tiny-llama", FLAGS, runs=1, triton_cache="asis")
    assert unreported == []
    (run,) = runs
    assert run.first_token_ids == list(in_process_output.token_ids)
    child = run.child
    # The parent's clock holds the child's whole life up to its token, and the engine's
    # start-up inside it.
    assert run.total_s >= child["child_total_s"]
    assert child["llm_init_s"] >= run.phases["engine total"] > 0
    assert run.total_s >= child["imports_s"] + child["llm_init_s"] + child["generate_s"]
    assert {"model load", "memory probe", "KV cache"} <= set(run.phases)


def test_serve_run_streams_the_in_process_token(in_process_output):
    (run,), _ = measure_startup("tiny-llama", FLAGS, runs=1, triton_cache="asis", serve=True)
    assert run.first_text == in_process_output.text
    assert run.total_s >= run.ready_s >= run.phases["engine total"] > 0


def test_cold_caches_are_fresh_per_run_and_warm_ones_shared(monkeypatch):
    seen: list[dict] = []

    def fake_run(model, flags, prompt, env, timeout_s):
        seen.append(env)
        return StartupRun(total_s=float(len(seen)))

    monkeypatch.setattr(startup_bench, "run_offline_once", fake_run)
    reported, unreported = measure_startup(None, [], runs=2, triton_cache="cold")
    assert len(reported) == 2 and not unreported
    assert seen[0]["TRITON_CACHE_DIR"] != seen[1]["TRITON_CACHE_DIR"]
    assert seen[0]["LADLE_CACHE_DIR"] != seen[1]["LADLE_CACHE_DIR"]
    seen.clear()
    reported, unreported = measure_startup(None, [], runs=2, triton_cache="warm")
    # The first run fills the shared caches and is not reported.
    assert [run.total_s for run in unreported] == [1.0]
    assert [run.total_s for run in reported] == [2.0, 3.0]
    assert len({env["TRITON_CACHE_DIR"] for env in seen}) == 1
    assert len({env["LADLE_CACHE_DIR"] for env in seen}) == 1


def test_summary_takes_the_median_run():
    runs = [StartupRun(total_s=value) for value in (5.0, 1.0, 3.0)]
    summary = summarize(runs, [])
    assert summary["first_token_s_median"] == 3.0
    assert summary["median_run"]["total_s"] == 3.0
    assert (summary["first_token_s_min"], summary["first_token_s_max"]) == (1.0, 5.0)


def test_phases_line_round_trips():
    clock = StartupClock()
    clock.add("model load", 1.234)
    clock.add("kernel builds", 0.5)
    clock.add("model load", 1.0)  # a phase seen twice adds up
    line = describe_startup_phases(clock.phases)
    text = f"noise\n[ladle] start-up phases: old 9.00 s\n{line}\nmore noise"
    assert parse_startup_phases(text) == {"model load": 2.23, "kernel builds": 0.5}
    assert parse_startup_phases("no such line") == {}


def test_bad_runs_count_is_refused():
    import argparse

    with pytest.raises(ValueError, match="--runs"):
        startup_bench.run_bench_startup(argparse.Namespace(runs=0))


def test_cli_writes_a_checkpoint_and_times_its_load(tmp_path, capsys):
    """`--write-checkpoint`: random weights of the preset written as a safetensors folder, then
    loaded by the child as users load one; its first token is the folder's in this process."""
    import json

    from ladle import LLM, SamplingParams
    from ladle.cli.main import main

    folder, report = tmp_path / "ckpt", tmp_path / "report.json"
    status = main(
        ["bench", "startup", "tiny-llama", "--write-checkpoint", str(folder),
         "--triton-cache", "asis", "--json", str(report)]
    )  # fmt: skip
    assert status == 0
    result = json.loads(report.read_text())
    assert result["model"] == str(folder)
    assert result["engine_flags"][:2] == ["--load-format", "auto"]
    assert "process start to first token" in capsys.readouterr().out
    llm = LLM(str(folder))
    assert llm.engine.info.load_source == "safetensors"
    expected = llm.generate(
        [{"prompt_token_ids": PROMPT_TOKEN_IDS}],
        SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    assert result["median_run"]["first_token_ids"] == list(expected.token_ids)
