"""LLM.generate's progress bar moves with every generated token and ends full, even when
requests stop early; the tokenizer a model runs with (random weights borrow the default's)."""

from __future__ import annotations

import pytest

from ladle import LLM, SamplingParams
from ladle.config import ModelConfig
from ladle.entrypoints import llm as llm_module
from ladle.entrypoints.progress import GenerationProgress
from ladle.frontend.tokenizer_source import resolve_tokenizer_source


def test_bar_counts_tokens_and_drops_unused_budget():
    progress = GenerationProgress(num_prompts=2, max_total_tokens=20, enabled=False)
    progress.add_tokens(3)
    progress.add_tokens(4)
    assert progress.num_generated_tokens == 7
    progress.finish_prompt(num_unused_tokens=6)  # one prompt stopped after 4 of its 10 tokens
    assert progress.max_total_tokens == 14 and progress.num_finished_prompts == 1
    progress.add_tokens(7)
    progress.finish_prompt(num_unused_tokens=0)
    assert progress.num_generated_tokens == progress.max_total_tokens == 14


def test_generate_advances_the_bar_every_step(tiny_model_path, monkeypatch):
    bars: list[GenerationProgress] = []
    steps: list[int] = []

    class Recording(GenerationProgress):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            bars.append(self)

        def add_tokens(self, num_tokens: int) -> None:
            steps.append(num_tokens)
            super().add_tokens(num_tokens)

    monkeypatch.setattr(llm_module, "GenerationProgress", Recording)
    llm = LLM(tiny_model_path("llama"), num_kv_blocks=64)
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=list(range(512))),
    ]
    outputs = llm.generate(["one two", "three four"], params, use_tqdm=True)
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    bar = bars[0]
    assert len(outputs[1].outputs[0].token_ids) == 1  # the second stopped at once
    # Tokens arrive step by step (12 steps for the long one), not once per finished prompt.
    assert len([s for s in steps if s]) >= 12
    assert bar.num_generated_tokens == generated == 13
    assert bar.max_total_tokens == 13
    assert bar.num_finished_prompts == 2


def test_random_weights_borrow_the_default_tokenizer():
    from ladle.model.default_model import resolve_default_model

    dummy = ModelConfig(model="qwen3-0.6b", load_format="dummy")
    assert resolve_tokenizer_source(dummy, None) == str(resolve_default_model())
    named = ModelConfig(model="qwen3-0.6b", load_format="dummy", tokenizer="/some/folder")
    assert resolve_tokenizer_source(named, None) == "/some/folder"
    assert resolve_tokenizer_source(ModelConfig(model="/m"), "/m") == "/m"


@pytest.mark.slow
def test_text_prompts_and_chat_on_a_dummy_preset():
    llm = LLM("smollm2-135m", load_format="dummy", num_kv_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    output = llm.generate("The capital of France is", params, use_tqdm=False)[0]
    assert output.prompt_token_ids == llm.get_tokenizer().encode("The capital of France is")
    assert len(output.outputs[0].token_ids) == 4
    reply = llm.chat([{"role": "user", "content": "hi"}], params, use_tqdm=False)[0]
    assert len(reply.outputs[0].token_ids) == 4
