"""Start-up's Triton build pass beside the weights' load (worker/builds_beside_loading.py): the
engine then serves the same tokens as with the pass after the load, builds no kernel variant
while serving, and logs the builds as their own start-up phase."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import GPU_SHAPE

from ladle import LLM, SamplingParams
from ladle.kernels.compile_log import compile_totals, start_compile_log

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# head_dim 128: the decode attention's common width (the shared GPU shape uses 64).
SHAPE = dict(GPU_SHAPE, head_dim=128, vocab_size=4096, max_position_embeddings=1024)
PROMPTS = [
    [(7 * index + 3 * row) % 4000 + 5 for index in range(n)] for row, n in enumerate((3, 40, 200))
]


def _tokens(path: str, beside: bool, monkeypatch) -> tuple[list[list[int]], LLM]:
    monkeypatch.setenv("LADLE_BUILDS_BESIDE_LOADING", "1" if beside else "0")
    llm = LLM(path, dtype="bfloat16", num_kv_blocks=512, max_num_seqs=8, max_model_len=1024)
    assert llm.engine.executor.worker.built_beside_loading == beside
    before = compile_totals()
    outputs = llm.generate(
        [{"prompt_token_ids": prompt} for prompt in PROMPTS],
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
        use_tqdm=False,
    )
    if beside and before is not None:
        assert compile_totals().since(before).num_builds == 0
    return [list(output.outputs[0].token_ids) for output in outputs], llm


def test_builds_beside_loading_serve_the_same_tokens(tmp_path, monkeypatch):
    from helpers.tiny_models import save_tiny_model

    start_compile_log()
    path = save_tiny_model(tmp_path, "qwen3", **SHAPE)
    beside, llm = _tokens(path, True, monkeypatch)
    phases = dict(llm.engine.startup_phases)
    assert phases["kernel builds"] > 0 and "model load" in phases
    del llm
    after, _ = _tokens(path, False, monkeypatch)
    assert beside == after
