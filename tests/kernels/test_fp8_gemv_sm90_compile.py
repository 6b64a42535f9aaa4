"""The fp8 GEMV's kernels (kernels/fp8_gemv.py) compile for Hopper (sm_90a) without a GPU
(Triton's bundled ptxas) at the tiles the batch-1 path and the benchmark's sweep launch, for
every scale and input kind: in the decode step's PDL chain (griddepcontrol.wait), the weight read
in 16-byte evict-first loads, and no register spills (ptxas -v). Specialised as Triton
specialises a real launch (pointers and the 8B's sizes divisible by 16). Skipped where Triton is
missing."""

from __future__ import annotations

import re
import subprocess

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ladle.kernels import fp8_gemv  # noqa: E402

pytestmark = pytest.mark.slow  # ~30 s of compiling on a 2-core machine

HOPPER = GPUTarget("cuda", 90, 32)
ALIGNED = {"x_ptr", "x_scale_ptr", "w_ptr", "scale_ptr", "bias_ptr", "out_ptr", "N", "K", "WIDTH"}
TYPES = dict(
    x_scale_ptr="*fp32", w_ptr="*fp8e4nv", scale_ptr="*fp32", bias_ptr="*bf16",
    out_ptr="*bf16", N="i32", K="i32", WIDTH="i32", num_groups="i32",
)  # fmt: skip


def _compile(kernel, x_type: str, constants: dict, tile: fp8_gemv.Fp8GemvTile):
    names = kernel.arg_names
    types = TYPES | {"x_ptr": x_type}
    signature = {name: types[name] for name in names if name in types}
    constexprs = {(names.index(name),): value for name, value in constants.items()}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in signature if n in ALIGNED}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": tile.num_warps, "num_stages": tile.num_stages}
    return triton.compile(source, target=HOPPER, options=options)


def _spilled_bytes(ptx: str, tmp_path) -> int:
    """Bytes of spill stores ptxas reports for the PTX built for sm_90a."""
    source = tmp_path / "kernel.ptx"
    source.write_text(ptx)
    ptxas = get_ptxas(90).path
    command = [ptxas, "-v", "--gpu-name", "sm_90a", str(source), "-o", str(tmp_path / "k.cubin")]
    report = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    spills = re.findall(r"(\d+) bytes spill stores", report)
    assert spills, report
    return sum(int(count) for count in spills)


@pytest.mark.parametrize("scale_group", [0, 128])
@pytest.mark.parametrize("x_type", ["*bf16", "*fp8e4nv"], ids=["row", "codes"])
def test_the_kernels_compile_for_hopper_in_the_pdl_chain_without_spills(
    scale_group, x_type, tmp_path
):
    tile = fp8_gemv.DEFAULT_TILE
    constants = dict(SCALE_GROUP=scale_group, HAS_X_SCALE=x_type != "*bf16",
                     BLOCK_K=tile.max_block_k, USE_PDL=True)  # fmt: skip
    kernels = (
        (fp8_gemv._fp8_gemv_kernel, constants | dict(HAS_BIAS=True, BLOCK_N=tile.block_n)),
        (fp8_gemv._fp8_gate_up_silu_kernel, constants | dict(BLOCK_N=tile.block_n // 2)),
    )
    for kernel, kernel_constants in kernels:
        ptx = _compile(kernel, x_type, kernel_constants, tile).asm["ptx"]
        assert "griddepcontrol.wait" in ptx  # in the decode step's PDL chain
        assert "ld.global.L1::evict_first.L2::cache_hint.v4.b32" in ptx  # 16-byte weight loads
        assert _spilled_bytes(ptx, tmp_path) == 0, kernel.__name__


def test_every_candidate_tile_compiles_without_spills(tmp_path):
    """Every tile scripts/fp8_gemm_bench.py --one-row sweeps builds for sm_90a within the
    registers."""
    spilled = {}
    for tile in fp8_gemv.CANDIDATE_TILES:
        constants = dict(SCALE_GROUP=0, HAS_X_SCALE=False, HAS_BIAS=False, BLOCK_N=tile.block_n,
                         BLOCK_K=tile.max_block_k, USE_PDL=True)  # fmt: skip
        ptx = _compile(fp8_gemv._fp8_gemv_kernel, "*bf16", constants, tile).asm["ptx"]
        spilled[tile] = _spilled_bytes(ptx, tmp_path)
    assert not any(spilled.values()), spilled
