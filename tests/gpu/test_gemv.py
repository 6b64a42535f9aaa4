"""ladle's one-row GEMV (kernels/gemv.py) against torch at awkward sizes, and the layers that
take it at batch 1 (Linear, the logits) against their torch path."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "n,k", [(1, 1), (7, 100), (1000, 16), (4097, 1029), (6144, 4096), (4096, 14336 + 3)]
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_matches_torch(dtype, n, k, with_bias):
    from ladle.kernels.gemv import gemv, gemv_applies

    generator = torch.Generator(device="cuda").manual_seed(n * 31 + k)
    x = torch.randn(1, k, device="cuda", dtype=dtype, generator=generator)
    weight = torch.randn(n, k, device="cuda", dtype=dtype, generator=generator) / k**0.5
    bias = torch.randn(n, device="cuda", dtype=dtype, generator=generator) if with_bias else None
    assert gemv_applies(x, weight)
    reference = x.double() @ weight.double().t()
    if bias is not None:
        reference += bias.double()
    got = gemv(x, weight, bias)
    assert got.dtype == dtype and got.shape == (1, n)
    # One rounding to the output dtype on top of a float32 sum.
    torch.testing.assert_close(got.double(), reference, rtol=1e-2, atol=1e-2)
    logits = gemv(x, weight, bias, out_dtype=torch.float32)
    torch.testing.assert_close(logits, got.float(), rtol=0, atol=0)


def test_gemv_refuses_what_it_does_not_handle():
    from ladle.kernels.gemv import gemv_applies

    weight = torch.randn(8, 16, device="cuda", dtype=torch.bfloat16)
    assert not gemv_applies(torch.randn(2, 16, device="cuda", dtype=torch.bfloat16), weight)
    assert not gemv_applies(torch.randn(1, 16, device="cuda"), weight)  # float32 row
    strided = torch.randn(1, 32, device="cuda", dtype=torch.bfloat16)[:, ::2]
    assert not gemv_applies(strided, weight)
    assert not gemv_applies(
        torch.randn(1, 16, device="cuda", dtype=torch.bfloat16), weight.t().contiguous().t()
    )


def test_linear_and_logits_at_batch_one_match_their_torch_path():
    from ladle.kernels.dispatch import set_fused_kernels
    from ladle.model.layers.embedding import compute_logits
    from ladle.model.layers.linear import Linear

    layer = Linear(4096, 1536, bias=True).cuda().to(torch.bfloat16)
    torch.nn.init.normal_(layer.weight, std=0.02)
    torch.nn.init.normal_(layer.bias, std=0.02)
    table = torch.randn(32003, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    fused = layer(x), compute_logits(x, table)
    previous = set_fused_kernels(False)
    try:
        plain = layer(x), compute_logits(x, table)
    finally:
        set_fused_kernels(previous)
    assert fused[1].dtype == torch.float32
    for got, expected in zip(fused, plain):
        # Both round a float32 sum to bfloat16; the sums' order differs.
        torch.testing.assert_close(got.float(), expected.float(), rtol=1.6e-2, atol=2e-3)


def test_gemv_reads_what_the_norm_before_it_wrote():
    """Launched with programmatic dependent launch (kernels/pdl.py), the GEMV loads its first
    weight tile while the RMSNorm that writes its input runs, and waits before reading x: fresh
    inputs each replay of a graph of norm -> GEMV -> norm -> GEMV give torch's result every time
    (a read before the wait would see the previous replay's activations)."""
    from ladle.bench.gpu_timing import capture_graph
    from ladle.kernels.gemv import gemv
    from ladle.kernels.pdl import pdl_enabled
    from ladle.kernels.rms_norm import rms_norm

    if not pdl_enabled(torch.device("cuda")):
        pytest.skip("PDL is off (LADLE_PDL=0 or a GPU before Hopper)")
    hidden = 4096
    weights = [
        torch.randn(n, hidden, device="cuda").to(torch.bfloat16) / hidden**0.5
        for n in (hidden, 14336)
    ]
    norm_weight = torch.rand(hidden, device="cuda").to(torch.bfloat16) + 0.5
    static_x = torch.randn(1, hidden, device="cuda").to(torch.bfloat16)

    def step():
        hidden_1 = gemv(rms_norm(static_x, norm_weight, 1e-5), weights[0])
        return gemv(rms_norm(hidden_1, norm_weight, 1e-5), weights[1])

    def reference():
        hidden_1 = rms_norm(static_x, norm_weight, 1e-5) @ weights[0].t()
        return rms_norm(hidden_1, norm_weight, 1e-5).float() @ weights[1].float().t()

    graph, static_out = capture_graph(step)
    for _ in range(5):
        static_x.copy_(torch.randn(1, hidden, device="cuda").to(torch.bfloat16))
        graph.replay()
        expected = reference()
        error = ((static_out.float() - expected).norm() / expected.norm()).item()
        assert error < 2e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width,k", [(1, 16), (7, 100), (33, 1029), (3072, 1024), (14336, 4096)])
def test_gate_up_silu_is_the_gemv_then_silu_and_mul_bit_for_bit(dtype, width, k):
    """One launch for the MLP's gate-up GEMV and SiLU-and-mul: the same bits as the two kernels
    it replaces, at odd widths (a program's features past the end) and the 0.6B / 8B shapes."""
    from ladle.kernels.activation import silu_and_mul
    from ladle.kernels.gemv import gate_up_silu, gemv

    generator = torch.Generator(device="cuda").manual_seed(width * 31 + k)
    x = torch.randn(1, k, device="cuda", dtype=dtype, generator=generator)
    weight = torch.randn(2 * width, k, device="cuda", dtype=dtype, generator=generator) / k**0.5
    got = gate_up_silu(x, weight)
    assert got.shape == (1, width) and got.dtype == dtype
    assert torch.equal(got, silu_and_mul(gemv(x, weight)))


def test_the_mlp_at_batch_one_takes_the_fused_launch_with_the_same_output():
    """LlamaMLP at one row on CUDA: gate_up_silu (one launch fewer) gives what the projection,
    SiLU-and-mul and the down projection give as separate launches; at two rows it is not used."""
    from ladle.model.models.llama import LlamaMLP

    mlp = LlamaMLP(1024, 3072).cuda().to(torch.bfloat16)
    for parameter in mlp.parameters():
        torch.nn.init.normal_(parameter, std=0.03)
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    assert mlp.gate_up_proj.gate_up_silu(x) is not None
    assert mlp.gate_up_proj.gate_up_silu(torch.cat([x, x])) is None
    separate = mlp.down_proj(mlp.act_fn(mlp.gate_up_proj(x)))
    assert torch.equal(mlp(x), separate)


def _norm_case(k: int, dtype: torch.dtype, seed: int):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(1, k, device="cuda", dtype=dtype, generator=generator)
    residual = torch.randn(1, k, device="cuda", dtype=dtype, generator=generator)
    norm_weight = (torch.rand(k, device="cuda", generator=generator) + 0.5).to(dtype)
    return x, residual, norm_weight


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", [(7, 100), (4096, 1024), (1024, 2048 - 5), (6144, 2048)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_gemv_norm_prologue_matches_the_norm_kernel_then_the_gemv(dtype, n, k, with_residual):
    """The GEMV with the RMSNorm folded in against rms_norm's kernel then the plain GEMV: the new
    residual bit for bit, the product within the rounding of a normalised element that the
    variance's different summation order can move by one unit."""
    from ladle.kernels.gemv import gemv
    from ladle.kernels.rms_norm import rms_norm

    x, residual, norm_weight = _norm_case(k, dtype, seed=n + k)
    weight = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
    new_residual = torch.empty_like(residual) if with_residual else None
    got = gemv(
        x,
        weight,
        norm_weight=norm_weight,
        eps=1e-6,
        residual=residual if with_residual else None,
        new_residual=new_residual,
    )
    separate_residual = residual.clone()
    normed = rms_norm(x, norm_weight, 1e-6, residual=separate_residual if with_residual else None)
    expected = gemv(normed, weight)
    if with_residual:
        assert torch.equal(new_residual, separate_residual)
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2, atol=1e-2)
    error = (got.float() - expected.float()).norm() / expected.float().norm()
    assert error < 3e-3


@pytest.mark.parametrize("width,k", [(33, 1029), (3072, 1024), (6144, 2048)])
def test_gate_up_silu_norm_prologue_matches_the_separate_kernels(width, k):
    from ladle.kernels.activation import silu_and_mul
    from ladle.kernels.gemv import gate_up_silu, gemv
    from ladle.kernels.rms_norm import rms_norm

    x, residual, norm_weight = _norm_case(k, torch.bfloat16, seed=width)
    weight = torch.randn(2 * width, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    new_residual = torch.empty_like(residual)
    got = gate_up_silu(
        x, weight, norm_weight=norm_weight, eps=1e-6, residual=residual, new_residual=new_residual
    )
    separate_residual = residual.clone()
    expected = silu_and_mul(gemv(rms_norm(x, norm_weight, 1e-6, separate_residual), weight))
    assert torch.equal(new_residual, separate_residual)
    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
    error = (got.float() - expected.float()).norm() / expected.float().norm()
    assert error < 3e-3


def test_norm_prologue_reads_what_the_kernel_before_it_wrote():
    """Under PDL the GEMV's norm prologue reads x and the residual only after its wait: a graph
    of four chained norm-GEMV launches, replayed on fresh inputs, gives the separate kernels'
    result each time (a read before the wait would see the previous replay's activations)."""
    from ladle.bench.gpu_timing import capture_graph
    from ladle.kernels.gemv import gemv
    from ladle.kernels.rms_norm import rms_norm

    hidden = 2048
    weights = [torch.randn(hidden, hidden, device="cuda").to(torch.bfloat16) / 40 for _ in range(4)]
    norm_weight = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16)
    static_x = torch.randn(1, hidden, device="cuda").to(torch.bfloat16)
    static_residual = torch.randn(1, hidden, device="cuda").to(torch.bfloat16)

    def step():
        x, residual = static_x, static_residual
        for weight in weights:
            new_residual = torch.empty_like(residual)
            x = gemv(
                x, weight, norm_weight=norm_weight, eps=1e-6, residual=residual,
                new_residual=new_residual,
            )  # fmt: skip
            residual = new_residual
        return torch.cat([x, residual])

    def reference():
        x, residual = static_x, static_residual.clone()
        for weight in weights:
            x = gemv(rms_norm(x, norm_weight, 1e-6, residual=residual), weight)
        return torch.cat([x, residual])

    graph, static_out = capture_graph(step)
    for _ in range(4):
        static_x.copy_(torch.randn(1, hidden, device="cuda").to(torch.bfloat16))
        static_residual.copy_(torch.randn(1, hidden, device="cuda").to(torch.bfloat16))
        graph.replay()
        expected = reference()
        error = ((static_out.float() - expected.float()).norm() / expected.float().norm()).item()
        assert error < 1e-2


def test_a_decoder_layer_at_batch_one_folds_its_norms_into_its_gemvs():
    """A Llama decoder layer at one row on CUDA hands both norms to the projections after them
    (DeferredNorm), and its output and residual match the layer with every norm its own launch;
    at two rows, or with a hook watching the projection's input, nothing is deferred."""
    from ladle.model.layers.deferred_norm import DeferredNorm, set_norm_prologue
    from ladle.model.models.llama import LlamaMLP

    mlp = LlamaMLP(1024, 3072).cuda().to(torch.bfloat16)
    for parameter in mlp.parameters():
        torch.nn.init.normal_(parameter, std=0.03)
    from ladle.model.layers.norm import RMSNorm

    norm = RMSNorm(1024, 1e-6).cuda().to(torch.bfloat16)
    torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
    x, residual, _ = _norm_case(1024, torch.bfloat16, seed=3)

    deferred, new_residual = norm(x, residual.clone(), into=mlp.gate_up_proj)
    assert isinstance(deferred, DeferredNorm)
    fused = mlp(deferred)
    previous = set_norm_prologue(False)
    try:
        plain_residual = residual.clone()
        normed, plain_residual = norm(x, plain_residual, into=mlp.gate_up_proj)
        assert isinstance(normed, torch.Tensor)
        plain = mlp(normed)
    finally:
        set_norm_prologue(previous)
    assert torch.equal(new_residual, plain_residual)
    torch.testing.assert_close(fused.float(), plain.float(), rtol=2e-2, atol=2e-2)

    two_rows = torch.cat([x, x])
    normed, _ = norm(two_rows, torch.cat([residual, residual]), into=mlp.gate_up_proj)
    assert isinstance(normed, torch.Tensor)
    handle = mlp.gate_up_proj.register_forward_pre_hook(lambda module, inputs: None)
    try:
        normed, _ = norm(x, residual.clone(), into=mlp.gate_up_proj)
        assert isinstance(normed, torch.Tensor)
    finally:
        handle.remove()
