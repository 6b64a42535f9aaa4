"""The drafted step's fused kernels (kernels/draft_steps.py, LADLE_DRAFT_KERNELS=1) compiled on
CUDA against the torch path of worker/drafts_on_device.py: with overlapped steps (the CUDA
default) and n-gram drafts made on the device, the same greedy tokens, and with synthetic
acceptance the same tokens and counters (the same coins), float32, graphs on."""

from __future__ import annotations

import random

import pytest
import torch
from helpers.tiny_models import GPU_SHAPE

from ladle import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# Device drafts are opt-in (config/speculative.py, until measured on a GPU).
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "adaptive": False,
    "drafts_on_device": True,
}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from helpers.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("draft_kernels_gpu"), "qwen3", **GPU_SHAPE)


def _prompts(count: int) -> list[dict]:
    rng = random.Random(0)
    prompts = []
    for _ in range(count):
        phrase = [rng.randrange(4, 500) for _ in range(rng.randint(2, 6))]
        prompts.append({"prompt_token_ids": phrase * rng.randint(2, 5)})
    return prompts


def _run(path, speculative: dict, kernels: bool, prompts, params):
    llm = LLM(str(path), dtype="float32", num_kv_blocks=4096, max_num_seqs=64,
              speculative_config=speculative)  # fmt: skip
    assert llm.engine.overlaps and llm.engine.scheduler.drafts_on_device
    llm.engine.executor.worker.runner.device_drafts.kernels = kernels
    outputs = llm.generate(prompts, params, use_tqdm=False)
    spec = llm.engine.get_stats().spec_decode
    result = (
        [list(o.outputs[0].token_ids) for o in outputs],
        spec.num_draft_tokens,
        spec.num_accepted_tokens,
    )
    del llm
    torch.cuda.empty_cache()
    return result


@pytest.mark.parametrize("synthetic", [None, 0.6])
def test_kernels_give_the_torch_paths_results(model_path, synthetic):
    speculative = dict(NGRAM, synthetic_acceptance=synthetic) if synthetic else NGRAM
    prompts = _prompts(48)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    torch_path = _run(model_path, speculative, False, prompts, params)
    kernels = _run(model_path, speculative, True, prompts, params)
    assert kernels == torch_path
    assert kernels[2] > 100
