"""Every fused MoE kernel variant the start-up tuner may try compiles for Hopper (sm_90) without a
GPU (Triton's bundled ptxas), and fits an H100's shared memory (227 KiB a block): a candidate
that did not would only be skipped at start-up, costing its build. Specialised as Triton
specialises a real launch (pointers and the model's sizes divisible by 16), so the software
pipelining (cp.async stages) is what the device runs. Skipped where Triton is missing."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ladle.kernels import fused_moe, moe_align_kernel, moe_routing  # noqa: E402
from ladle.kernels.moe_tiles import GROUP_SCALES, NO_SCALES  # noqa: E402
from ladle.kernels.moe_tuning import GROUPED_SHAPES, ROWS_SHAPES  # noqa: E402

pytestmark = pytest.mark.slow  # ~40 s of compiling on a 2-core machine

HOPPER = GPUTarget("cuda", 90, 32)
H100_SHARED_BYTES = 227 * 1024
ALIGNED = {
    "x_ptr", "w_ptr", "scale_ptr", "out_ptr", "sorted_ids_ptr", "block_expert_ptr",
    "num_rows_ptr", "routing_weights_ptr", "topk_ids_ptr", "N", "K", "stride_x", "stride_we",
    "stride_wn", "stride_out",
}  # fmt: skip


def _compile(kernel, types: dict, constants: dict, num_warps: int, num_stages: int):
    names = kernel.arg_names
    signature = {name: types[name] for name in names if name in types}
    constexprs = {(names.index(name),): value for name, value in constants.items()}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in signature if n in ALIGNED}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(source, target=HOPPER, options=options)


def _types(weight_type: str, out_type: str) -> dict:
    types = dict(
        x_ptr="*bf16", w_ptr=weight_type, scale_ptr="*fp32", out_ptr=out_type,
        sorted_ids_ptr="*i32", block_expert_ptr="*i32", num_rows_ptr="*i32",
        routing_weights_ptr="*bf16", topk_ids_ptr="*i64",
    )  # fmt: skip
    for name in ("num_assignments", "N", "K", "stride_x", "stride_we", "stride_wn",
                 "stride_se", "stride_sn", "stride_out"):  # fmt: skip
        types[name] = "i32"
    return types


@pytest.mark.parametrize(
    "weight_type,scales", [("*bf16", NO_SCALES), ("*fp8e4nv", GROUP_SCALES)], ids=["bf16", "fp8"]
)
def test_every_candidate_compiles_for_hopper_within_shared_memory(weight_type, scales):
    for block_m, shapes in GROUPED_SHAPES.items():
        for block_n, block_k, warps, stages in shapes:
            constants = dict(TOP_K=8, SCALES=scales, SCALE_GROUP=128, BLOCK_M=block_m,
                             BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=4)  # fmt: skip
            for kernel, out in ((fused_moe._grouped_gate_up_kernel, "*bf16"),
                                (fused_moe._grouped_down_kernel, "*fp32")):  # fmt: skip
                compiled = _compile(kernel, _types(weight_type, out), constants, warps, stages)
                shared = compiled.metadata.shared
                assert shared <= H100_SHARED_BYTES, (kernel.__name__, constants, shared)
                if stages > 1:
                    assert "cp.async" in compiled.asm["ptx"]  # the K loop is pipelined
    for block_n, block_k, warps in ROWS_SHAPES:
        constants = dict(TOP_K=8, SCALES=scales, SCALE_GROUP=128, BLOCK_N=block_n,
                         BLOCK_K=block_k, USE_PDL=True)  # fmt: skip
        for kernel, more in ((fused_moe._rows_gate_up_kernel, {}),
                             (fused_moe._rows_down_kernel, {"SLOTS": 8})):  # fmt: skip
            compiled = _compile(kernel, _types(weight_type, "*bf16"), constants | more, warps, 3)
            assert "griddepcontrol.wait" in compiled.asm["ptx"]  # in the decode step's PDL chain


def test_alignment_and_routing_compile_for_hopper():
    align = _compile(
        moe_align_kernel._align_kernel,
        dict(ids_ptr="*i64", sorted_ids_ptr="*i32", block_expert_ptr="*i32",
             num_rows_ptr="*i32", num_assignments="i32", max_rows="i32"),  # fmt: skip
        dict(NUM_EXPERTS=128, EXPERTS_POW2=128, BLOCK_M=16, CHUNK=128, FILL=1024),
        moe_align_kernel.NUM_WARPS,
        1,
    )
    assert align.metadata.shared <= H100_SHARED_BYTES
    _compile(
        moe_routing._topk_softmax_kernel,
        dict(logits_ptr="*bf16", weights_ptr="*bf16", ids_ptr="*i64", counts_ptr="*i64",
             num_experts="i32", stride_logits="i32"),  # fmt: skip
        dict(TOP_K=8, EXPERTS_POW2=128, RENORMALIZE=True, COUNT=True, USE_PDL=True),
        1,
        1,
    )
