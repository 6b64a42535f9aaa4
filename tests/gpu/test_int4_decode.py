"""The int4 decode kernels (kernels/int4_decode.py) and the per-shape plan (quant/int4_plan.py)
against the torch reference (dequantize, then matmul in float32) at awkward sizes, split-K
reduced in the launch under CUDA graph replays, and bad input."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = torch.device("cuda")
GROUP = 128


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert torch.isfinite(actual).all()
    expected = expected.double()
    return ((actual.double() - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def quantized(outputs: int, inputs: int, seed: int, symmetric: bool = False):
    from ladle.model.layers.quant.int4 import pack_int4_rows, quantize_int4_groups

    generator = torch.Generator(device=CUDA).manual_seed(seed)
    weight = torch.randn(outputs, inputs, device=CUDA, generator=generator)
    codes, scale, zero = quantize_int4_groups(weight, symmetric=symmetric)
    packed_t = pack_int4_rows(codes).t().contiguous()
    return packed_t, scale.t().contiguous(), zero.t().to(torch.float16).contiguous()


def assert_close_to_reference(
    actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-2
) -> None:
    """The kernels sum in float32 and round once to the activation dtype: every output within one
    rounding step of the exact float32 product (2^-8 relative for bf16, 2^-11 for fp16; twice
    that for the float32 sums' order), and the whole close in norm."""
    step = 2.0**-7 if actual.dtype == torch.bfloat16 else 2.0**-10
    torch.testing.assert_close(actual.float(), expected, rtol=step, atol=atol)
    assert relative_error(actual, expected) < 5e-3


def all_kernels():
    from ladle.kernels.int4_decode import GEMV_KERNELS, MMA_KERNELS

    return list(GEMV_KERNELS) + list(MMA_KERNELS)


def kernel_ids() -> list[str]:
    """The kernels' names where Triton imports (the module is collected on CPU-only CI too)."""
    try:
        return [str(kernel).replace("/", "-") for kernel in all_kernels()]
    except ImportError:
        return []


KERNEL_IDS = kernel_ids()


@pytest.mark.parametrize("kernel_index", range(len(KERNEL_IDS)), ids=KERNEL_IDS)
@pytest.mark.parametrize("tokens", [1, 3, 16, 17, 64])
@pytest.mark.parametrize(
    # N = 1 and 7, K not a multiple of the group (200, 100, 1000), a long K (split-K), a wide N.
    "outputs,inputs",
    [(1, 256), (7, 200), (130, 100), (520, 1000), (512, 14336), (4096, 4096), (28672, 512)],
)
def test_int4_decode_kernels_match_reference(kernel_index, tokens, outputs, inputs):
    from ladle.kernels.int4_decode import GEMV_MAX_TOKENS, int4_decode_matmul
    from ladle.kernels.int4_matmul import int4_matmul_reference

    kernel = all_kernels()[kernel_index]
    if kernel.kind == "gemv" and tokens > GEMV_MAX_TOKENS:
        pytest.skip("the GEMV serves at most GEMV_MAX_TOKENS rows")
    if kernel.kind == "row" and tokens > 1:
        pytest.skip("the one-row kernel serves one row (test_one_row_kernel_*)")
    packed_t, scale_t, zero_t = quantized(outputs, inputs, seed=tokens * outputs + inputs)
    x = torch.randn(tokens, inputs, device=CUDA).to(torch.bfloat16)
    actual = int4_decode_matmul(x, packed_t, scale_t, zero_t, GROUP, kernel)
    expected = int4_matmul_reference(x, packed_t, scale_t, zero_t, GROUP)
    assert actual.shape == (tokens, outputs) and actual.dtype == torch.bfloat16
    assert_close_to_reference(actual, expected)


@pytest.mark.parametrize("kernel_index", range(len(KERNEL_IDS)), ids=KERNEL_IDS)
def test_int4_decode_kernels_take_float16_and_symmetric_weights(kernel_index):
    from ladle.kernels.int4_decode import int4_decode_matmul
    from ladle.kernels.int4_matmul import int4_matmul_reference

    packed_t, scale_t, zero_t = quantized(1000, 4096 + 72, seed=3, symmetric=True)
    generator = torch.Generator(device=CUDA).manual_seed(kernel_index)
    x = torch.randn(5, 4096 + 72, device=CUDA, generator=generator).to(torch.float16)
    kernel = all_kernels()[kernel_index]
    if kernel.kind == "row":
        pytest.skip("the one-row kernel serves one row (test_one_row_kernel_*)")
    actual = int4_decode_matmul(x, packed_t, scale_t, zero_t, GROUP, kernel)
    assert actual.dtype == torch.float16
    expected = int4_matmul_reference(x, packed_t, scale_t, zero_t, GROUP)
    # float16 codes enter the tensor cores as 1024 + q and the 1024 * sum(x) leaves after the
    # float32 dot: that cancellation costs ~2^-13 of each group's sum (bfloat16's 128 + q costs
    # 8x less). An unseeded draw once measured 0.0145 off on a near-zero output.
    assert_close_to_reference(actual, expected, atol=3e-2 if kernel.kind == "mma" else 1e-2)


@pytest.mark.parametrize("kernel_index", [0, 3, -1], ids=["gemv", "gemv-rows2", "mma"])
def test_split_k_is_deterministic_and_replays_in_a_cuda_graph(kernel_index):
    """The last-arriving split reduces in split order and resets its counter: repeated calls are
    bitwise equal, and graph replays with new inputs stay right (a counter left non-zero would
    make the next launch reduce too early or never)."""
    from ladle.kernels.int4_decode import int4_decode_matmul
    from ladle.kernels.int4_matmul import int4_matmul_reference
    from ladle.kernels.split_counters import counter_buffer

    kernel = all_kernels()[kernel_index]
    packed_t, scale_t, zero_t = quantized(4096, 14336, seed=7)
    x = torch.randn(4, 14336, device=CUDA).to(torch.bfloat16)
    args = (packed_t, scale_t, zero_t, GROUP, kernel)
    first = int4_decode_matmul(x, *args)
    for _ in range(3):
        assert torch.equal(int4_decode_matmul(x, *args), first)
    assert int(counter_buffer(x.device).abs().sum()) == 0
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        int4_decode_matmul(static_x, *args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = int4_decode_matmul(static_x, *args)
    for seed in range(3):
        static_x.copy_(torch.randn(4, 14336, device=CUDA, generator=None).to(torch.bfloat16))
        graph.replay()
        expected = int4_matmul_reference(static_x, packed_t, scale_t, zero_t, GROUP)
        assert relative_error(static_out, expected) < 5e-3, seed
    assert int(counter_buffer(x.device).abs().sum()) == 0


def test_plan_picks_a_correct_kernel_per_bucket_and_the_layer_follows_it():
    from ladle.kernels.int4_matmul import int4_matmul_reference
    from ladle.model.layers.linear import Linear
    from ladle.model.layers.quant import quantize_linears_
    from ladle.model.layers.quant.int4_plan import BUCKETS

    layer = Linear(4096 + 64, 3000).to(CUDA, torch.bfloat16)
    layer.weight.data.normal_(0.0, 0.02)
    quantize_linears_(torch.nn.Sequential(layer), "int4")
    plan = layer.int4_plan
    assert plan is not None and len(plan.kernels) == len(BUCKETS)
    assert plan.rejected == {}, plan.rejected
    assert all(plan.timings_us[bucket] for bucket in BUCKETS)
    for tokens in (1, 2, 5, 16, 40, 200, 300):
        x = torch.randn(tokens, 4096 + 64, device=CUDA).to(torch.bfloat16)
        expected = int4_matmul_reference(x, layer.packed_t, layer.scale_t, layer.zero_t, GROUP)
        assert relative_error(layer(x), expected) < 1e-2, tokens


def test_bad_int4_input_is_a_clear_error():
    from ladle.kernels.int4_decode import int4_decode_matmul

    packed_t, scale_t, zero_t = quantized(64, 256, seed=1)
    x = torch.randn(2, 256, device=CUDA).to(torch.bfloat16)
    with pytest.raises(ValueError, match="scales"):
        int4_decode_matmul(x, packed_t, scale_t[:1], zero_t, GROUP)
    with pytest.raises(ValueError, match="group size"):
        int4_decode_matmul(x, packed_t, scale_t, zero_t, 96)
    with pytest.raises(ValueError, match="inputs"):
        int4_decode_matmul(
            torch.randn(2, 512, device=CUDA).bfloat16(), packed_t, scale_t, zero_t, GROUP
        )
    with pytest.raises(ValueError, match="float16"):
        int4_decode_matmul(x.float(), packed_t, scale_t, zero_t, GROUP)


ROW_KERNELS = [(16, 2, 4), (32, 4, 2), (64, 8, 1), (32, 4, 8)]  # (block_n, warps, groups)


@pytest.mark.parametrize("block_n,warps,groups", ROW_KERNELS)
@pytest.mark.parametrize(
    # N = 1 and 7, K not a multiple of the group or of 8 (200, 100, 1000, 4160 + 5), groups not
    # a multiple of the kernel's chunk (14336 = 112 groups), a wide N.
    "outputs,inputs",
    [(1, 256), (7, 200), (130, 100), (520, 1000), (512, 14336), (4096, 4096), (28672, 512)],
)
def test_one_row_kernel_matches_reference(block_n, warps, groups, outputs, inputs):
    from ladle.kernels.int4_decode import Int4Kernel, int4_decode_matmul
    from ladle.kernels.int4_matmul import int4_matmul_reference

    kernel = Int4Kernel("row", block_n, warps, groups=groups)
    packed_t, scale_t, zero_t = quantized(outputs, inputs, seed=outputs + inputs + groups)
    x = torch.randn(1, inputs, device=CUDA).to(torch.bfloat16)
    actual = int4_decode_matmul(x, packed_t, scale_t, zero_t, GROUP, kernel)
    expected = int4_matmul_reference(x, packed_t, scale_t, zero_t, GROUP)
    assert actual.shape == (1, outputs) and actual.dtype == torch.bfloat16
    assert_close_to_reference(actual, expected)


def test_one_row_kernel_takes_float16_symmetric_weights_and_refuses_two_rows():
    from ladle.kernels.int4_decode import Int4Kernel, int4_decode_matmul
    from ladle.kernels.int4_matmul import int4_matmul_reference

    kernel = Int4Kernel("row", 32, 4, groups=4)
    packed_t, scale_t, zero_t = quantized(1000, 4096 + 72, seed=3, symmetric=True)
    x = torch.randn(1, 4096 + 72, device=CUDA).to(torch.float16)
    actual = int4_decode_matmul(x, packed_t, scale_t, zero_t, GROUP, kernel)
    assert actual.dtype == torch.float16
    assert_close_to_reference(actual, int4_matmul_reference(x, packed_t, scale_t, zero_t, GROUP))
    with pytest.raises(ValueError, match="one token row"):
        int4_decode_matmul(x.repeat(2, 1), packed_t, scale_t, zero_t, GROUP, kernel)


@pytest.mark.parametrize("kernel_index", range(len(KERNEL_IDS)), ids=KERNEL_IDS)
def test_gemv_reads_what_the_norm_before_it_wrote(kernel_index):
    """Launched with programmatic dependent launch (kernels/pdl.py), the GEMV starts while the
    RMSNorm that writes its input is still running and waits before reading it: fresh inputs
    each replay of a graph of norm -> GEMV -> norm -> GEMV must give the reference every time
    (a read before the wait would see the previous replay's activations)."""
    from ladle.bench.gpu_timing import capture_graph
    from ladle.kernels.dispatch import set_fused_kernels
    from ladle.kernels.int4_decode import int4_decode_matmul
    from ladle.kernels.int4_matmul import int4_matmul_reference
    from ladle.kernels.pdl import pdl_enabled
    from ladle.kernels.rms_norm import rms_norm
    from ladle.model.layers.norm import RMSNorm

    kernel = all_kernels()[kernel_index]
    if kernel.kind == "mma":
        pytest.skip("the mma kernel serves prefill batches and is launched without PDL")
    if not pdl_enabled(CUDA):
        pytest.skip("PDL is off (LADLE_PDL=0 or a GPU before Hopper)")
    hidden = 4096
    first = quantized(hidden, hidden, seed=11)
    second = quantized(14336, hidden, seed=12)
    norm_weight = torch.rand(hidden, device=CUDA).to(torch.bfloat16) + 0.5
    rows = 1 if kernel.kind == "row" else 2
    static_x = torch.randn(rows, hidden, device=CUDA).to(torch.bfloat16)

    def step():
        hidden_1 = int4_decode_matmul(rms_norm(static_x, norm_weight, 1e-5), *first, GROUP, kernel)
        return int4_decode_matmul(rms_norm(hidden_1, norm_weight, 1e-5), *second, GROUP, kernel)

    norm = RMSNorm(hidden, 1e-5).to(CUDA, torch.bfloat16)
    norm.weight.data.copy_(norm_weight)

    def reference():  # the torch norm, the dequantized weights
        previous = set_fused_kernels(False)
        try:
            hidden_1 = int4_matmul_reference(norm(static_x), *first, GROUP).to(torch.bfloat16)
            return int4_matmul_reference(norm(hidden_1), *second, GROUP)
        finally:
            set_fused_kernels(previous)

    for _ in range(3):  # eagerly, back to back
        static_x.copy_(torch.randn(rows, hidden, device=CUDA).to(torch.bfloat16))
        assert relative_error(step(), reference()) < 2e-2
    graph, static_out = capture_graph(step)
    for _ in range(5):
        static_x.copy_(torch.randn(rows, hidden, device=CUDA).to(torch.bfloat16))
        graph.replay()
        assert relative_error(static_out, reference()) < 2e-2
