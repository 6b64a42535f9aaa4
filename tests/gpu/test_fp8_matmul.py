"""ladle's decode-size FP8 matmul (kernels/fp8_matmul.py) against float32 torch over the same
e4m3 codes and scales, at awkward sizes (rows 1..128, columns and K off the tile sizes)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("fast", [True, False], ids=["fast-accum", "precise"])
@pytest.mark.parametrize("tokens", [1, 5, 16, 17, 33, 64, 65, 100, 128])
@pytest.mark.parametrize("n,k", [(48, 272), (1000, 4096), (4096, 14336), (28672, 4096)])
def test_fp8_matmul_matches_float32_over_the_codes(tokens, n, k, fast):
    from ladle.kernels.fp8_matmul import NARROW_COLUMNS, decode_tile, fp8_matmul

    if tokens > 64 and n > NARROW_COLUMNS:
        assert decode_tile(tokens, n, fast_accumulation=fast) is None  # cuBLASLt's
        return

    generator = torch.Generator(device="cuda").manual_seed(tokens * 7 + n)
    weight = (torch.randn(n, k, device="cuda", generator=generator) * 64).clamp(-448, 448)
    codes_w = weight.to(torch.float8_e4m3fn)
    x = (torch.randn(tokens, k, device="cuda", generator=generator) * 64).clamp(-448, 448)
    codes_x = x.to(torch.float8_e4m3fn)
    x_scale = torch.rand(tokens, 1, device="cuda", generator=generator) * 1e-2 + 1e-3
    w_scale = torch.rand(n, device="cuda", generator=generator) * 1e-3 + 1e-4
    tile = decode_tile(tokens, n, fast_accumulation=fast)
    assert tile is not None
    got = fp8_matmul(codes_x, codes_w, x_scale, w_scale, tile)
    expected = (codes_x.float() * x_scale) @ (codes_w.float() * w_scale[:, None]).t()
    assert got.dtype == torch.bfloat16 and got.shape == (tokens, n)
    error = ((got.float() - expected).norm() / expected.norm()).item()
    # The bfloat16 rounding of the result is ~1.7e-3 in norm here; the 64-row tiles' reduced-
    # precision wgmma sums (fast accumulation) measured 2.1-3.4e-3 (fp8_tile_precision_probe.py).
    assert error < (5e-3 if fast and tile.block_m == 64 else 2e-3)
    if n % 16 == 0 and k % 16 == 0 and not (fast and tile.block_m == 64):
        cublas = torch._scaled_mm(
            codes_x,
            codes_w.t(),
            scale_a=x_scale,
            scale_b=w_scale[None, :],
            out_dtype=torch.bfloat16,
        )
        torch.testing.assert_close(got.float(), cublas.float(), rtol=2e-2, atol=1e-2)


def test_tile_rule_and_more_rows_take_cublas():
    from ladle.kernels.fp8_matmul import PRECISE_ACCUMULATION, decode_tile

    assert decode_tile(129, 4096) is None
    assert decode_tile(65, 6144) is None
    assert decode_tile(65, 4096).block_m == decode_tile(128, 4096).block_m == 64
    assert decode_tile(16, 4096).block_m == 16
    assert decode_tile(32, 4096).block_m == 16
    wide = decode_tile(17, 28672, fast_accumulation=False)
    assert wide.block_m == 64 and wide.max_imprecise_acc == PRECISE_ACCUMULATION
    assert decode_tile(64, 4096, fast_accumulation=False).max_imprecise_acc == 128
    assert decode_tile(64, 4096, fast_accumulation=True).max_imprecise_acc is None


@pytest.mark.parametrize("tokens", [1, 33, 64])
def test_matmul_reads_what_the_quantization_before_it_wrote(tokens):
    """Launched with programmatic dependent launch (kernels/pdl.py), the GEMM loads its first
    weight tile while per_token_quant writes its input codes, and waits before reading them:
    fresh inputs each replay of a graph of quantize -> GEMM give the float32 result every time."""
    from ladle.bench.gpu_timing import capture_graph
    from ladle.kernels.fp8_matmul import decode_tile, fp8_matmul
    from ladle.kernels.pdl import pdl_enabled
    from ladle.kernels.per_token_quant import per_token_quant

    if not pdl_enabled(torch.device("cuda")):
        pytest.skip("PDL is off (LADLE_PDL=0 or a GPU before Hopper)")
    n, k = 4096, 14336
    codes_w = (torch.randn(n, k, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    w_scale = torch.rand(n, device="cuda") * 1e-3 + 1e-4
    tile = decode_tile(tokens, n)
    static_x = torch.randn(tokens, k, device="cuda").to(torch.bfloat16)

    def step():
        codes_x, x_scale = per_token_quant(static_x, torch.float8_e4m3fn)
        return fp8_matmul(codes_x, codes_w, x_scale, w_scale, tile)

    graph, static_out = capture_graph(step)
    for _ in range(5):
        static_x.copy_(torch.randn(tokens, k, device="cuda").to(torch.bfloat16))
        graph.replay()
        codes_x, x_scale = per_token_quant(static_x, torch.float8_e4m3fn)
        expected = (codes_x.float() * x_scale) @ (codes_w.float() * w_scale[:, None]).t()
        error = ((static_out.float() - expected).norm() / expected.norm()).item()
        assert error < 5e-3
