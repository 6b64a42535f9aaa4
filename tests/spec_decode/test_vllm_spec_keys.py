"""vLLM's --speculative-config spellings: its documentation's draft-model example (no `method`),
its EAGLE examples (`draft_tensor_parallel_size`) and v0's `model: "[ngram]"` run in ladle as
they do in vLLM, and a draft tensor-parallel size ladle cannot honour is refused by name."""

from __future__ import annotations

import pytest
from helpers.eagle_heads import save_eagle_head

from ladle import LLM, SamplingParams
from ladle.config import SpeculativeConfig
from ladle.spec_decode.vllm_spec_keys import from_vllm_spellings, infer_speculative_method

ENGINE_OPTIONS = {"cpu_kv_cache_gib": 0.05, "block_size": 4, "max_num_seqs": 8}


def test_method_is_inferred_from_the_draft_as_vllm_does(tiny_model_path, tmp_path):
    target = tiny_model_path("llama")
    assert infer_speculative_method(target) == "draft_model"
    assert infer_speculative_method(save_eagle_head(tmp_path, target, "eagle3")) == "eagle3"
    assert infer_speculative_method(save_eagle_head(tmp_path, target, "eagle")) == "eagle"
    # Hub ids that are not on disk: vLLM matches the name.
    assert infer_speculative_method("yuhuili/EAGLE-LLaMA3-Instruct-8B") == "eagle"
    assert infer_speculative_method("RedHatAI/Llama-3.1-8B-speculator.eagle3") == "eagle3"
    assert infer_speculative_method("facebook/opt-125m") == "draft_model"


def test_vllm_spellings_become_ladle_keys():
    ngram = SpeculativeConfig.from_dict({"model": "[ngram]", "num_speculative_tokens": 3})
    assert (ngram.method, ngram.model, ngram.num_speculative_tokens) == ("ngram", None, 3)
    eagle = from_vllm_spellings(
        {"model": "x/EAGLE-LLaMA3", "draft_tensor_parallel_size": 1, "num_speculative_tokens": 2}
    )
    assert eagle == {"model": "x/EAGLE-LLaMA3", "method": "eagle", "num_speculative_tokens": 2}
    suffix = SpeculativeConfig.from_dict(
        {"method": "suffix", "num_speculative_tokens": 4,
         "suffix_decoding_max_cached_requests": 50}
    )
    assert suffix.suffix_max_cached_requests == 50
    with pytest.raises(ValueError, match="the same setting"):
        from_vllm_spellings({"suffix_decoding_max_cached_requests": 5,
                             "suffix_max_cached_requests": 6})
    # vLLM's suffix-tree keys ladle has no equivalent for are named, not dropped.
    with pytest.raises(ValueError, match="unknown key.*suffix_decoding_max_tree_depth"):
        SpeculativeConfig.from_dict({"method": "suffix", "suffix_decoding_max_tree_depth": 24})
    # An explicit method wins over the name.
    assert from_vllm_spellings({"method": "draft_model", "model": "x/eagle3"})["method"] == (
        "draft_model"
    )
    # Still required when nothing says how to draft.
    with pytest.raises(ValueError, match="speculative_config.method is required"):
        SpeculativeConfig.from_dict({"num_speculative_tokens": 2})


@pytest.mark.parametrize("value", [2, 0, True, "1"])
def test_a_draft_tensor_parallel_size_other_than_one_is_refused_by_name(value):
    config = {"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": value}
    with pytest.raises(ValueError, match="speculative_config.draft_tensor_parallel_size"):
        SpeculativeConfig.from_dict(config)


def test_vllm_docs_draft_model_example_runs_and_keeps_greedy_tokens(tiny_model_path):
    """vLLM's documented `speculative_config={"model": DRAFT, "num_speculative_tokens": 5}`:
    the target drafting for itself accepts drafts, and the tokens are those without drafts."""
    target = tiny_model_path("llama")
    prompts = [{"prompt_token_ids": [7, 8, 9, 10, 11, 12]}, {"prompt_token_ids": [40, 41, 42]}]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in LLM(target, **ENGINE_OPTIONS).generate(
        prompts, params, use_tqdm=False)]
    llm = LLM(
        target,
        speculative_config={"model": target, "num_speculative_tokens": 3,
                            "draft_tensor_parallel_size": 1},
        **ENGINE_OPTIONS,
    )
    assert llm.config.scheduler.speculative.method == "draft_model"
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert llm.engine.get_stats().spec_decode.num_accepted_tokens > 0
