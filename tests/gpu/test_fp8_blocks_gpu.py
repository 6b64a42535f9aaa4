"""Block-scaled fp8 on the GPU (quant/fp8_block.py): the per-group activation kernel against its
torch rule bit for bit, the grouped fp8 matmul against float32 over the same codes at awkward
sizes, and a block checkpoint served on CUDA (in-memory logits, CUDA graphs against eager)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CUDA = torch.device("cuda")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 7, 33])
@pytest.mark.parametrize("cols", [1, 100, 128, 129, 576, 4096])
@pytest.mark.parametrize("group", [32, 64, 128, 256])
def test_per_group_quant_is_its_torch_rule_bit_for_bit(dtype, rows, cols, group):
    from ladle.kernels.per_token_quant import per_group_quant
    from ladle.kernels.per_token_rule import per_group_quant_reference

    generator = torch.Generator(device="cuda").manual_seed(rows * cols + group)
    x = torch.randn(rows, cols, device="cuda", generator=generator).to(dtype) * 3
    x[:, ::37] *= 50
    codes, scale = per_group_quant(x, torch.float8_e4m3fn, group)
    expected_codes, expected_scale = per_group_quant_reference(x, torch.float8_e4m3fn, group)
    assert torch.equal(scale, expected_scale)
    assert torch.equal(codes.view(torch.uint8), expected_codes.view(torch.uint8))


@pytest.mark.parametrize("tokens", [1, 7, 16, 17, 33, 64, 65, 200, 300, 1024])
@pytest.mark.parametrize("n,k,group", [(48, 272, 128), (1000, 4096, 128), (4096, 576, 64),
                                       (200, 129, 32), (6144, 4096, 256)])  # fmt: skip
def test_grouped_fp8_matmul_matches_float32_over_the_codes(tokens, n, k, group):
    from ladle.kernels.fp8_matmul import fp8_matmul, grouped_tile

    generator = torch.Generator(device="cuda").manual_seed(tokens * 7 + n)
    num_groups = -(-k // group)
    codes_w = (torch.randn(n, k, device="cuda", generator=generator) * 64).clamp(-448, 448)
    codes_w = codes_w.to(torch.float8_e4m3fn)
    codes_x = (torch.randn(tokens, k, device="cuda", generator=generator) * 64).clamp(-448, 448)
    codes_x = codes_x.to(torch.float8_e4m3fn)
    # Scales that differ by group, so a kernel that applied one per row would be far off.
    x_scale = torch.rand(tokens, num_groups, device="cuda", generator=generator) * 1e-2 + 1e-4
    w_scale = torch.rand(n, num_groups, device="cuda", generator=generator) * 1e-3 + 1e-5
    tile = grouped_tile(tokens, n, group)
    got = fp8_matmul(codes_x, codes_w, x_scale, w_scale, tile, grouped=True)
    expand = lambda scale: scale.repeat_interleave(group, 1)[:, :k]  # noqa: E731
    expected = (codes_x.float() * expand(x_scale)) @ (codes_w.float() * expand(w_scale)).t()
    assert got.dtype == torch.bfloat16 and got.shape == (tokens, n)
    error = ((got.float() - expected).norm() / expected.norm()).item()
    # bfloat16 rounding of the result ~1.7e-3; the wgmma tiles sum each group's products at
    # reduced precision (fast accumulation) before they are scaled into float32.
    assert error < 5e-3


def test_grouped_fp8_matmul_refuses_scales_of_the_wrong_shape():
    from ladle.kernels.fp8_matmul import fp8_matmul, grouped_tile

    codes = torch.zeros(4, 256, device="cuda").to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="do not fit K=256 in groups of 128"):
        fp8_matmul(
            codes, codes, torch.ones(4, 1, device="cuda"), torch.ones(4, 2, device="cuda"),
            grouped_tile(4, 4, 128), grouped=True,
        )  # fmt: skip


@pytest.mark.parametrize("tokens", [1, 5, 300])
@pytest.mark.parametrize(
    "outputs,inputs",
    [(200, 129), (1536, 576), (4096, 4096), (16384, 1024), (384, 14336), (256, 640)],
)
def test_block_layer_on_cuda_computes_the_cpu_numbers(tokens, outputs, inputs):
    """The same layer (codes, block scales, input) on CUDA and on the CPU, which computes the
    rule in float32: equal up to the GPU's bfloat16 result and summation order, whichever GEMM
    the GPU picks (cuBLASLt's block-scaled one for whole 128-blocks, except the wide projection
    at decode sizes; the grouped Triton tiles otherwise). One row takes the fp8 GEMV, which does
    not quantize x: its reference is x times the dequantized weight."""
    from ladle.model.layers.linear import Linear
    from ladle.model.layers.quant.base import install_canonical_
    from ladle.model.layers.quant.fp8_block import Fp8BlockMethod, can_use_block_scaled_mm

    method = Fp8BlockMethod(128, 128)
    generator = torch.Generator().manual_seed(tokens + outputs)
    weight = torch.randn(outputs, inputs, generator=generator) * 0.05
    tensors = method.quantize(weight)
    x = torch.randn(tokens, inputs, generator=generator).bfloat16()
    results = []
    for device in (CUDA, torch.device("cpu")):
        layer = Linear(inputs, outputs, bias=False).to(device)
        install_canonical_(layer, method, {k: v.to(device) for k, v in tensors.items()})
        method.finalize(layer)
        if device == CUDA:
            whole_blocks = outputs % 128 == 0 and inputs % 512 == 0
            expect_cublas = whole_blocks and can_use_block_scaled_mm(CUDA)
            assert (layer.cublas_weight_scale is not None) == expect_cublas
        results.append(layer(x.to(device)).float().cpu())
    on_gpu, on_cpu = results
    if tokens == 1:  # one row on CUDA is weight-only (the fp8 GEMV, quant/fp8_one_row.py)
        on_cpu = x.float() @ method.dequantize(tensors, inputs).t()
    assert ((on_gpu - on_cpu).norm() / on_cpu.norm()).item() < 5e-3


def test_hopper_with_cuda_12_9_takes_cublas_block_scaling():
    """The probe is right where cuBLASLt has the recipe (Hopper, CUDA 12.9+): a probe that
    failed there would send every block layer to the slower Triton tiles, silently."""
    from ladle.model.layers.quant.fp8_block import can_use_block_scaled_mm

    cuda = tuple(int(part) for part in (torch.version.cuda or "0.0").split(".")[:2])
    if torch.cuda.get_device_capability() != (9, 0) or cuda < (12, 9):
        pytest.skip("cuBLASLt's block-scaled fp8 GEMM needs Hopper and CUDA 12.9+")
    assert can_use_block_scaled_mm(CUDA)


@pytest.fixture(scope="module")
def block_folder(tmp_path_factory) -> str:
    """A ladle-written 128 x 128 block fp8 folder of a tiny model whose projections are whole
    blocks, and the float model it came from."""
    from helpers.tiny_models import save_gemm_aligned_tiny_model

    from ladle.model.loader.quantized_writer import write_quantized_checkpoint

    base = tmp_path_factory.mktemp("fp8_blocks_gpu")
    float_dir = save_gemm_aligned_tiny_model(base)
    out = base / "blocks"
    write_quantized_checkpoint(
        float_dir, out, "fp8", "hf-fp8", torch.bfloat16, weight_block_size=128
    )
    return float_dir, str(out)


def test_block_checkpoint_on_cuda_gives_in_memory_block_logits(block_folder):
    from test_quant_kernels import _load, _logits, relative_error

    from ladle.model.layers.quant import quantize_linears_
    from ladle.model.layers.quant.fp8_block import Fp8BlockMethod

    float_dir, folder = block_folder
    loaded = _load(folder)
    assert all(
        isinstance(m.quant_method, Fp8BlockMethod)
        for m in loaded.model.modules()
        if getattr(m, "quant_method", None) is not None
    )
    reference = _load(float_dir)
    bf16 = _logits(reference)
    quantize_linears_(reference.model, Fp8BlockMethod(128, 128))
    in_memory = _logits(reference)
    assert torch.equal(_logits(loaded), in_memory)
    # The tiny random model amplifies perturbations (per-channel fp8 measures ~0.15 here).
    assert 0 < relative_error(in_memory, bf16) < 0.3


def test_block_checkpoint_under_cuda_graphs_matches_eager(block_folder):
    from helpers.graph_parity import assert_graphs_track_eager

    assert_graphs_track_eager(block_folder[1])
