"""The model's generation_config.json supplies request defaults (vLLM's --generation-config
auto), offline and on the server; 'vllm' turns it off; a request's own value always wins."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ladle import LLM, SamplingParams
from ladle.config import ModelConfig
from ladle.entrypoints.openai.protocol import CompletionRequest
from ladle.entrypoints.openai.sampling import build_sampling_params
from ladle.model.generation_defaults import read_generation_defaults


@pytest.fixture(scope="module")
def model_with_generation_config(tiny_model_path, tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("genconfig") / "model"
    shutil.copytree(tiny_model_path("llama"), folder)
    (folder / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20})
    )
    return str(folder)


def test_reads_the_sampling_fields(model_with_generation_config) -> None:
    defaults = read_generation_defaults(model_with_generation_config, "auto")
    assert defaults == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert read_generation_defaults(model_with_generation_config, "vllm") == {}


def test_greedy_generation_config_supplies_nothing(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"do_sample": False, "temperature": 0.6})
    )
    assert read_generation_defaults(str(tmp_path), "auto") == {}


def test_bad_generation_config_value_is_named() -> None:
    with pytest.raises(ValueError, match="generation_config 'nowhere'"):
        ModelConfig(generation_config="nowhere")


def test_offline_defaults_apply_only_when_params_are_not_given(
    model_with_generation_config, capsys
) -> None:
    llm = LLM(model_with_generation_config, num_kv_blocks=32)
    assert "temperature=0.6" in capsys.readouterr().out
    default = llm.get_default_sampling_params()
    assert (default.temperature, default.top_p, default.top_k) == (0.6, 0.95, 20)
    off = LLM(model_with_generation_config, num_kv_blocks=32, generation_config="vllm")
    assert off.get_default_sampling_params().temperature == 1.0


def test_generate_without_params_samples_with_the_defaults(tiny_model_path, tmp_path) -> None:
    # top_k=1 makes sampling greedy: observable proof that generate(None) used the defaults.
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path("llama"), folder)
    (folder / "generation_config.json").write_text(json.dumps({"top_k": 1, "temperature": 1.0}))
    llm = LLM(str(folder), num_kv_blocks=32)
    prompts = ["hello world", "the cat sat"]
    from_defaults = llm.generate(prompts, None, use_tqdm=False)
    greedy = llm.generate(prompts, SamplingParams(temperature=0.0), use_tqdm=False)
    for got, want in zip(from_defaults, greedy):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids


def test_server_request_fields_win_over_defaults() -> None:
    defaults = {"temperature": 0.6, "top_k": 20}
    unset = CompletionRequest.model_validate({"prompt": "x"})
    params = build_sampling_params(unset, 4, None, defaults=defaults)
    assert (params.temperature, params.top_k, params.top_p) == (0.6, 20, 1.0)
    explicit = CompletionRequest.model_validate({"prompt": "x", "temperature": 0.0})
    assert build_sampling_params(explicit, 4, None, defaults=defaults).temperature == 0.0
