"""Act-order int4 checkpoints (quant/act_order.py) and group sizes other than 128 on the GPU: a
folder gives on CUDA, within bfloat16's rounding, the logits of a float32 model holding its
dequantized weights; CUDA graphs agree with eager."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CUDA = torch.device("cuda")
MERGED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@pytest.fixture(scope="module")
def act_order_folder(tmp_path_factory) -> tuple[str, str, dict[str, torch.Tensor]]:
    """(float model, its act-order GPTQ folder, each projection's dequantized weight)."""
    from helpers.int4_folders import write_act_order_folder
    from helpers.tiny_models import save_gemm_aligned_tiny_model

    base = tmp_path_factory.mktemp("act_order_gpu")
    float_dir = save_gemm_aligned_tiny_model(base)
    weights = write_act_order_folder(float_dir, base / "gptq")
    return float_dir, str(base / "gptq"), weights


def _load(path: str, dtype: torch.dtype):
    from ladle.attention.triton_backend import TritonAttentionBackend
    from ladle.config import ModelConfig
    from ladle.model.loader import load_model

    return load_model(ModelConfig(model=path), CUDA, dtype, TritonAttentionBackend())


@torch.no_grad()
def _logits(loaded, dtype: torch.dtype) -> torch.Tensor:
    from helpers.tiny_models import PagedBatch, make_kv_caches

    prompts = [list(range(4, 40)), list(range(50, 57)), [9]]
    input_ids, positions, metadata = PagedBatch(len(prompts), 16, 32).step(prompts, device=CUDA)
    caches = make_kv_caches(loaded.arch_config, 32, 16, dtype=dtype, device=CUDA)
    logits = loaded.model.compute_logits(loaded.model(input_ids, positions, caches, metadata))
    return logits.float()


def test_act_order_checkpoint_on_cuda_computes_its_dequantized_weights(act_order_folder):
    float_dir, folder, weights = act_order_folder
    loaded = _load(folder, torch.bfloat16)
    permuted = [
        m for m in loaded.model.modules() if getattr(m, "input_permutation", None) is not None
    ]
    assert permuted and all(m.input_permutation.is_cuda for m in permuted)
    assert _error_against_dequantized(loaded, float_dir, weights) < 0.05


@pytest.mark.parametrize(
    "fmt,group_size,act_order", [("gptq", 32, False), ("gptq", -1, True), ("awq", 64, False)]
)
def test_other_group_sizes_on_cuda_compute_their_dequantized_weights(
    tmp_path, fmt, group_size, act_order
):
    from helpers.int4_folders import write_int4_folder
    from helpers.tiny_models import save_gemm_aligned_tiny_model

    float_dir = save_gemm_aligned_tiny_model(tmp_path)
    weights = write_int4_folder(float_dir, tmp_path / "int4", fmt, group_size, act_order)
    loaded = _load(str(tmp_path / "int4"), torch.bfloat16)
    assert _error_against_dequantized(loaded, float_dir, weights) < 0.05


def _error_against_dequantized(loaded, float_dir: str, weights: dict[str, torch.Tensor]) -> float:
    """Relative error of a loaded int4 model's bf16 logits against a float32 model holding the
    checkpoint's dequantized weights."""
    reference = _load(float_dir, torch.float32)
    for module_name, module in reference.model.named_modules():
        base, _, leaf = module_name.rpartition(".")
        names = [f"{base}.{part}" for part in MERGED.get(leaf, (leaf,))]
        if all(name in weights for name in names):
            module.weight.data.copy_(torch.cat([weights[name] for name in names]).to(CUDA))
    expected = _logits(reference, torch.float32)
    got = _logits(loaded, torch.bfloat16)
    # bfloat16 activations and KV through the tiny random model (std-0.1 weights amplify) stay
    # within 0.05; reading the words without the permutation gives 1.4 (tests/model/).
    return ((got - expected).norm() / expected.norm()).item()


def test_act_order_checkpoint_under_cuda_graphs_matches_eager(act_order_folder):
    from helpers.graph_parity import assert_graphs_track_eager

    assert_graphs_track_eager(act_order_folder[1])
