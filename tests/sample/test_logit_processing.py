"""logit_bias and allowed_token_ids: the sparse edits against a dense torch reference, and their
effect through the offline LLM."""

from __future__ import annotations

import pytest
import torch

from ladle import LLM, SamplingParams
from ladle.sample.logit_processing import apply_logit_edits_, build_logit_edits


def reference(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    expected = logits.clone()
    for row, p in enumerate(params):
        if p.allowed_token_ids:
            keep = torch.zeros(logits.shape[-1], dtype=torch.bool)
            keep[[t for t in p.allowed_token_ids if t < logits.shape[-1]]] = True
            expected[row, ~keep] = float("-inf")
        for token_id, value in (p.logit_bias or {}).items():
            if token_id < logits.shape[-1]:
                expected[row, token_id] += value
    return expected


@pytest.mark.parametrize("vocab_size", [1, 7, 33])
def test_edits_match_dense_reference(vocab_size: int) -> None:
    generator = torch.Generator().manual_seed(vocab_size)
    params = [
        SamplingParams(),
        SamplingParams(logit_bias={0: 5.0, vocab_size - 1: -3.5, vocab_size + 4: 1.0}),
        SamplingParams(allowed_token_ids=[0, vocab_size - 1, vocab_size + 10]),
        SamplingParams(allowed_token_ids=[0], logit_bias={0: -100.0}),
    ]
    logits = torch.randn(len(params), vocab_size, generator=generator)
    edits = build_logit_edits(params, vocab_size)
    actual = logits.clone()
    apply_logit_edits_(actual, edits)
    torch.testing.assert_close(actual, reference(logits, params))
    assert build_logit_edits([SamplingParams()], vocab_size) is None


def test_validation_names_the_field() -> None:
    assert SamplingParams(logit_bias={"5": 2}).logit_bias == {5: 2.0}
    with pytest.raises(ValueError, match="logit_bias values"):
        SamplingParams(logit_bias={5: 101})
    with pytest.raises(ValueError, match="logit_bias keys"):
        SamplingParams(logit_bias={"a": 1})
    with pytest.raises(ValueError, match="allowed_token_ids must not be empty"):
        SamplingParams(allowed_token_ids=[])
    with pytest.raises(ValueError, match="allowed_token_ids must be a list"):
        SamplingParams(allowed_token_ids=[-1])


def test_offline_effects(tiny_model_path) -> None:
    llm = LLM(tiny_model_path("llama"), num_kv_blocks=64)
    prompts = ["hello world", "the cat sat"]
    allowed = llm.generate(
        prompts, SamplingParams(max_tokens=8, seed=1, allowed_token_ids=[5, 6, 7]), use_tqdm=False
    )
    for output in allowed:
        assert set(output.outputs[0].token_ids) <= {5, 6, 7}
    forced = llm.generate(
        prompts, SamplingParams(max_tokens=5, seed=2, logit_bias={9: 100.0}), use_tqdm=False
    )
    for output in forced:
        assert output.outputs[0].token_ids == [9] * 5
