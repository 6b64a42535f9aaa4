"""`ladle generate` prints what the offline LLM generates for the same prompt."""

from __future__ import annotations

from ladle import LLM, SamplingParams
from ladle.cli import main


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
