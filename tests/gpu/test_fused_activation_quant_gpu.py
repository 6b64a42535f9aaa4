"""RMSNorm and SiLU-and-mul quantizing their output per token in the same launch
(kernels/rms_norm.py rms_norm_quant, kernels/activation.py silu_and_mul_quant) against the pair
they replace (the bf16 kernel, then kernels/per_token_quant.py): codes and scales bit for bit,
the residual stream unchanged, at awkward sizes (rows 1, 7, 64, 300; widths 576, 1000, 4096,
14336). Then an fp8 model: its logits with the fusion linked at load (quant/input_fusion.py)
equal those with it switched off (LADLE_FUSED_ACTIVATION_QUANT=0 or enabled=False), eagerly and
under CUDA graphs. tests/model/test_fused_activation_quant.py covers the CPU side."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = torch.device("cuda")
ROWS = [1, 7, 64, 300]
# 576 (SmolLM2's hidden), 1000 (no power of two near: a masked tail in the block), the 8B's
# hidden and intermediate sizes.
WIDTHS = [576, 1000, 4096, 14336]
CODE_DTYPES = [torch.float8_e4m3fn, torch.int8]


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if actual.dtype == torch.float8_e4m3fn:
        actual, expected = actual.view(torch.uint8), expected.view(torch.uint8)
    mismatched = (actual != expected).sum().item()
    assert mismatched == 0, f"{mismatched} of {actual.numel()} elements differ"


def _rows(num_rows: int, width: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    generator = torch.Generator(device=CUDA).manual_seed(seed)
    x = torch.randn(num_rows, width, generator=generator, device=CUDA) * scale
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("code_dtype", CODE_DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("hidden", WIDTHS)
@pytest.mark.parametrize("num_rows", ROWS)
def test_rms_norm_quant_is_rms_norm_then_per_token_quant(
    num_rows, hidden, with_residual, code_dtype
):
    from ladle.kernels.per_token_quant import per_token_quant
    from ladle.kernels.rms_norm import rms_norm, rms_norm_quant

    x = _rows(num_rows, hidden, num_rows * 31 + hidden)
    weight = (1 + 0.1 * _rows(1, hidden, hidden).float()).to(torch.bfloat16)[0]
    residual = _rows(num_rows, hidden, num_rows + hidden, scale=1.0) if with_residual else None
    if num_rows > 1:
        x[1] = 0  # an all-zero token (with no residual) must not give NaN
        if residual is not None:
            residual[1] = 0
    expected_residual = residual.clone() if with_residual else None
    expected_codes, expected_scale = per_token_quant(
        rms_norm(x, weight, 1e-5, residual=expected_residual), code_dtype
    )
    codes, scale = rms_norm_quant(x, weight, 1e-5, code_dtype, residual=residual)
    assert_same_bits(codes, expected_codes)
    assert scale.shape == (num_rows, 1)
    assert_same_bits(scale, expected_scale)
    if with_residual:
        assert_same_bits(residual, expected_residual)
    assert torch.isfinite(codes.float()).all() and torch.isfinite(scale).all()


@pytest.mark.parametrize("code_dtype", CODE_DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("num_rows", ROWS)
def test_silu_and_mul_quant_is_silu_and_mul_then_per_token_quant(num_rows, width, code_dtype):
    from ladle.kernels.activation import silu_and_mul, silu_and_mul_quant
    from ladle.kernels.per_token_quant import per_token_quant

    x = _rows(num_rows, 2 * width, num_rows * 17 + width)
    if num_rows > 1:
        x[1] = 0
    expected_codes, expected_scale = per_token_quant(silu_and_mul(x), code_dtype)
    codes, scale = silu_and_mul_quant(x, code_dtype)
    assert_same_bits(codes, expected_codes)
    assert_same_bits(scale, expected_scale)


def test_strided_rows_and_empty_batches():
    from ladle.kernels.activation import silu_and_mul, silu_and_mul_quant
    from ladle.kernels.per_token_quant import per_token_quant
    from ladle.kernels.rms_norm import rms_norm, rms_norm_quant

    wide = _rows(9, 1200, 5)
    x = wide[:, :1000]  # rows 1200 apart
    weight = torch.ones(1000, device=CUDA, dtype=torch.bfloat16)
    codes, scale = rms_norm_quant(x, weight, 1e-6, torch.float8_e4m3fn)
    expected_codes, expected_scale = per_token_quant(rms_norm(x, weight, 1e-6), codes.dtype)
    assert_same_bits(codes, expected_codes)
    assert_same_bits(scale, expected_scale)
    gate_up = wide[:, :1100]
    codes, scale = silu_and_mul_quant(gate_up, torch.float8_e4m3fn)
    expected_codes, expected_scale = per_token_quant(silu_and_mul(gate_up), codes.dtype)
    assert_same_bits(codes, expected_codes)
    assert_same_bits(scale, expected_scale)
    empty_codes, empty_scale = rms_norm_quant(x[:0], weight, 1e-6, torch.float8_e4m3fn)
    assert empty_codes.shape == (0, 1000) and empty_scale.shape == (0, 1)
    empty_codes, empty_scale = silu_and_mul_quant(gate_up[:0], torch.float8_e4m3fn)
    assert empty_codes.shape == (0, 550) and empty_scale.shape == (0, 1)


def test_bad_operands_are_named():
    from ladle.kernels.activation import silu_and_mul_quant
    from ladle.kernels.rms_norm import rms_norm_quant

    x = _rows(4, 64, 0)
    weight = torch.ones(64, device=CUDA, dtype=torch.bfloat16)
    e4m3 = torch.float8_e4m3fn
    with pytest.raises(ValueError, match="row-contiguous"):
        rms_norm_quant(x.view(2, 2, 64), weight, 1e-6, e4m3)
    with pytest.raises(ValueError, match="weight of shape"):
        rms_norm_quant(x, weight.float(), 1e-6, e4m3)
    with pytest.raises(ValueError, match="residual"):
        rms_norm_quant(x, weight, 1e-6, e4m3, residual=x[:2].clone())
    with pytest.raises(ValueError, match="float16"):
        rms_norm_quant(x, weight, 1e-6, torch.float16)
    with pytest.raises(ValueError, match=r"\[M, 2 \* d\]"):
        silu_and_mul_quant(x[:, :63], e4m3)


@pytest.mark.parametrize("num_rows", [1, 7, 64, 300])
def test_layers_hand_over_the_quantized_output_once_linked(num_rows):
    from ladle.kernels.activation import FUSED_QUANT_MIN_ROWS
    from ladle.kernels.per_token_quant import per_token_quant
    from ladle.model.layers.activation import SiluAndMul
    from ladle.model.layers.norm import RMSNorm
    from ladle.model.layers.quantized_activation import QuantizedActivation

    e4m3 = torch.float8_e4m3fn
    norm = RMSNorm(4096, 1e-5).to(CUDA, torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * _rows(1, 4096, 3)[0].float())
    x = _rows(num_rows, 4096, num_rows)
    residual = _rows(num_rows, 4096, num_rows + 1)
    expected_residual = residual.clone()
    expected_plain = norm(x)
    expected_output, _ = norm(x, expected_residual)
    activation = SiluAndMul()
    gate_up = _rows(num_rows, 2 * 14336, 7)
    expected_activation = activation(gate_up)

    norm.output_quantization = activation.output_quantization = e4m3
    plain = norm(x)
    output, new_residual = norm(x, residual)
    activated = activation(gate_up)
    handed_over = [(plain, expected_plain), (output, expected_output)]
    if num_rows >= FUSED_QUANT_MIN_ROWS:
        handed_over.append((activated, expected_activation))
    else:  # below its row count SiLU-and-mul hands over the plain product: the pair runs
        assert not isinstance(activated, QuantizedActivation)
        assert_same_bits(activated, expected_activation)
    for handed, expected in handed_over:
        assert isinstance(handed, QuantizedActivation) and handed.dtype == torch.bfloat16
        assert handed.shape == expected.shape
        expected_codes, expected_scale = per_token_quant(expected, e4m3)
        assert_same_bits(handed.codes, expected_codes)
        assert_same_bits(handed.scale, expected_scale)
    assert new_residual is residual
    assert_same_bits(residual, expected_residual)
    # Operands the fused kernel does not take (a [tokens, heads, dim] view): the plain tensor.
    assert isinstance(norm(x.view(num_rows, 1, 4096)), torch.Tensor)


@pytest.fixture(scope="module")
def tiny_fp8_model(tmp_path_factory) -> str:
    from helpers.tiny_models import save_gemm_aligned_tiny_model

    # Three layers: the last stays bf16 (KEEP_LAST_LAYERS).
    return save_gemm_aligned_tiny_model(
        tmp_path_factory.mktemp("fused_quant_gpu"), num_hidden_layers=3
    )


def _load(path: str, **options):
    from ladle.attention.triton_backend import TritonAttentionBackend
    from ladle.config import ModelConfig
    from ladle.model.loader import load_model

    config = ModelConfig(model=path, **options)
    return load_model(config, CUDA, torch.bfloat16, TritonAttentionBackend())


@torch.no_grad()
def _prefill_and_decode_logits(loaded) -> list[torch.Tensor]:
    """Logits of a 44-token prefill step (the _scaled_mm path) and a 3-row decode step after it
    (ladle's Triton fp8 GEMM)."""
    from helpers.tiny_models import PagedBatch, make_kv_caches

    batch = PagedBatch(3, 16, 32)
    caches = make_kv_caches(loaded.arch_config, 32, 16, dtype=torch.bfloat16, device=CUDA)
    logits = []
    for chunks in ([list(range(4, 40)), list(range(50, 57)), [9]], [[41], [58], [10]]):
        input_ids, positions, metadata = batch.step(chunks, device=CUDA)
        hidden = loaded.model(input_ids, positions, caches, metadata)
        logits.append(loaded.model.compute_logits(hidden))
    return logits


def _producer_dtypes(model) -> list[torch.dtype | None]:
    return [
        module.output_quantization
        for module in model.modules()
        if hasattr(module, "output_quantization")
    ]


def test_fp8_model_logits_are_the_same_with_and_without_the_fusion(tiny_fp8_model, monkeypatch):
    from ladle.model.layers.quant.input_fusion import (
        FUSED_ACTIVATION_QUANT_ENV,
        link_quantized_inputs_,
    )

    monkeypatch.delenv(FUSED_ACTIVATION_QUANT_ENV, raising=False)
    loaded = _load(tiny_fp8_model, quantization="fp8")
    # Layers 0 and 1 (their norms and activation); layer 2 and Qwen's q/k norms stay plain.
    assert _producer_dtypes(loaded.model).count(torch.float8_e4m3fn) == 6
    fused = _prefill_and_decode_logits(loaded)
    assert link_quantized_inputs_(loaded.model, enabled=False) == 0
    unfused = _prefill_and_decode_logits(loaded)
    monkeypatch.setenv(FUSED_ACTIVATION_QUANT_ENV, "0")
    switched_off = _load(tiny_fp8_model, quantization="fp8")
    assert set(_producer_dtypes(switched_off.model)) == {None}
    reference = _prefill_and_decode_logits(switched_off)
    for step in range(2):
        assert torch.isfinite(fused[step]).all()
        assert torch.equal(fused[step], unfused[step])
        assert torch.equal(fused[step], reference[step])
    # bf16 and the other methods are untouched: nothing links there.
    for options in ({}, {"quantization": "int8"}, {"quantization": "int4"}):
        monkeypatch.delenv(FUSED_ACTIVATION_QUANT_ENV, raising=False)
        assert set(_producer_dtypes(_load(tiny_fp8_model, **options).model)) == {None}


def test_fp8_greedy_tokens_under_cuda_graphs_are_the_same_with_and_without_the_fusion(
    tiny_fp8_model, monkeypatch
):
    from ladle.entrypoints.llm import LLM
    from ladle.model.layers.quant.input_fusion import FUSED_ACTIVATION_QUANT_ENV
    from ladle.sampling.params import SamplingParams

    prompts = [[5, 6, 7, 8, 9], list(range(20, 60)), [100, 3], list(range(200, 230))]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    results = []
    for switch in ("1", "0"):
        monkeypatch.setenv(FUSED_ACTIVATION_QUANT_ENV, switch)
        llm = LLM(
            tiny_fp8_model,
            device="cuda",
            dtype="bfloat16",
            quantization="fp8",
            num_kv_blocks=64,
        )
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        results.append([list(o.outputs[0].token_ids) for o in outputs])
        del llm
    assert results[0] == results[1]
