"""`ladle generate` prints what the offline LLM generates for the same prompt."""

from __future__ import annotations

import io

import pytest

from ladle import LLM, SamplingParams
from ladle.cli.generate import EXIT_INTERRUPTED, run_generate
from ladle.cli.main import EXIT_MODEL_LOAD_FAILED, main


def test_generate_prints_the_offline_result(tiny_model_path, capsys):
    path = tiny_model_path("llama")
    prompt = "the cat sat on the mat"
    expected = (
        LLM(path, num_kv_blocks=64)
        .generate([prompt], SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)[0]
        .outputs[0]
    )
    capsys.readouterr()
    code = main(
        ["generate", path, "--prompt", prompt, "--max-tokens", "6", "--num-kv-blocks", "64"]
    )
    captured = capsys.readouterr()
    assert code == 0
    assert captured.out == expected.text + "\n"
    assert f"[{expected.finish_reason}; {len(expected.token_ids)} tokens" in captured.err


def test_bad_option_is_a_clear_error(tiny_model_path, capsys):
    code = main(["generate", tiny_model_path("llama"), "--prompt", "x", "--max-tokens", "0"])
    assert code == 2
    assert "max_tokens must be an integer in [1, " in capsys.readouterr().err


def test_version(capsys):
    import ladle

    with pytest.raises(SystemExit) as raised:
        main(["--version"])
    assert raised.value.code == 0
    assert capsys.readouterr().out.strip() == f"ladle {ladle.__version__}"


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_missing_model_exits_with_the_status_serve_uses(tmp_path, capsys, command):
    # tests/entrypoints/test_serve_faults.py checks that serve exits EXIT_MODEL_LOAD_FAILED too.
    code = main([command, str(tmp_path / "missing"), "--prompt", "x"])
    assert code == EXIT_MODEL_LOAD_FAILED == 1
    assert "does not exist" in capsys.readouterr().err


class _Recorder(io.StringIO):
    """stdout that remembers each write, to see text arrive in pieces."""

    def __init__(self, interrupt_after: int | None = None) -> None:
        super().__init__()
        self.writes: list[str] = []
        self.interrupt_after = interrupt_after

    def write(self, text: str) -> int:
        if self.interrupt_after is not None and len(self.writes) >= self.interrupt_after:
            self.interrupt_after = None  # Ctrl-C once, as a user presses it
            raise KeyboardInterrupt
        self.writes.append(text)
        return super().write(text)


def test_text_streams_in_prompt_order(tiny_model_path):
    path = tiny_model_path("llama")
    llm = LLM(path, num_kv_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = ["the cat sat on the mat", "once upon a time", "hello"]
    expected = llm.generate(prompts, params, use_tqdm=False)
    out, err = _Recorder(), io.StringIO()
    assert run_generate(llm, prompts, params, chat=False, out=out, err=err) == 0
    assert out.getvalue() == "".join(o.outputs[0].text + "\n" for o in expected)
    # The first prompt's text arrived as it was generated, not in one piece at the end.
    first_text = expected[0].outputs[0].text
    pieces_of_first = []
    for piece in out.writes:
        if piece == "\n":
            break
        pieces_of_first.append(piece)
    assert "".join(pieces_of_first) == first_text and len(pieces_of_first) > 1
    timing_lines = err.getvalue().splitlines()
    assert len(timing_lines) == 3 and all("[length; 8 tokens; ttft" in t for t in timing_lines)


def test_ctrl_c_stops_cleanly_and_leaves_no_request_behind(tiny_model_path):
    llm = LLM(tiny_model_path("llama"), num_kv_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    out, err = _Recorder(interrupt_after=2), io.StringIO()
    code = run_generate(llm, ["a", "b"], params, chat=False, out=out, err=err)
    assert code == EXIT_INTERRUPTED
    assert "[interrupted]" in err.getvalue()
    assert not llm.engine.has_unfinished_requests()
    # The engine is usable afterwards.
    again = llm.generate(["a"], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(again[0].outputs[0].token_ids) == 3


def test_dummy_preset_with_a_named_tokenizer(tiny_model_path, capsys):
    # tiny-llama's 512 ids fit the tiny tokenizer; every command takes --tokenizer.
    code = main(
        [
            "generate",
            "tiny-llama",
            "--load-format",
            "dummy",
            "--tokenizer",
            tiny_model_path("llama"),
            "--prompt",
            "the cat",
            "--max-tokens",
            "4",
            "--num-kv-blocks",
            "64",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "[length; 4 tokens" in captured.err or "[stop;" in captured.err


def _help_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as raised:
        main([*argv, "--help"])
    assert raised.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_serve_help_explains_the_model_flag(capsys):
    help_text = _help_of(["serve"], capsys)
    assert "MODEL_OPTION" not in help_text
    assert "--model MODEL the model, as a flag" in help_text


@pytest.mark.parametrize("argv", [["bench"], ["bench", "throughput"], ["bench", "latency"]])
def test_bench_help_says_what_each_workload_is(argv, capsys):
    from ladle.bench.workloads import WORKLOADS

    help_text = _help_of(argv, capsys)
    for name in WORKLOADS:
        assert f" {name} " in help_text
    assert "Qwen3-0.6B shape" in help_text and "Llama-3.1-8B shape" in help_text
    assert "32, 128 and 256 in flight" in help_text
