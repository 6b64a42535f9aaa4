"""Expert parallelism's token dispatch (distributed/expert_dispatch.py) on 2 CPU processes over
gloo: the all-to-all and all-reduce forms of one MoE layer give the single-process layer's output
(fp32), also when a rank's slice is empty and when every token's experts are on one rank; the
start-up measurement (`auto`) gives the same table on both ranks, naming implemented forms; an
unknown dispatch name is refused naming the field and the flag. (Whole tiny models under forced
all-to-all and `auto`: tests/engine/test_moe_parallel.py.)"""

from __future__ import annotations

import argparse
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ladle.config import ParallelConfig
from ladle.distributed.expert_dispatch import (
    ALLREDUCE,
    ALLTOALL,
    DISPATCH_FORMS,
    DispatchTable,
    forced_table,
)
from ladle.distributed.tensor_parallel import TensorParallel
from ladle.model.layers.moe import SparseMoeBlock

NUM_RANKS = 2
HIDDEN, INTERMEDIATE, NUM_EXPERTS, TOP_K = 16, 8, 8, 3
ONE_RANK_TOP_K = 2  # top-k within one rank's 4 experts, for the "all on one rank" steps


def _block(tp: TensorParallel, top_k: int) -> SparseMoeBlock:
    """A block with the same seeded weights on every process; an expert-parallel rank keeps
    its own experts' slice of the stacks."""
    generator = torch.Generator().manual_seed(1)
    router = torch.randn(NUM_EXPERTS, HIDDEN, generator=generator)
    gate_up = torch.randn(NUM_EXPERTS, 2 * INTERMEDIATE, HIDDEN, generator=generator) / 4
    down = torch.randn(NUM_EXPERTS, HIDDEN, INTERMEDIATE, generator=generator) / 4
    block = SparseMoeBlock(HIDDEN, NUM_EXPERTS, top_k, INTERMEDIATE, True, tp)
    block.init_buffers()
    block.gate.weight.data.copy_(router)
    mine = slice(block.experts.first_expert, block.experts.first_expert + block.experts.num_experts)
    block.experts.gate_up_proj.data.copy_(gate_up[mine])
    block.experts.down_proj.data.copy_(down[mine])
    return block


def _onto_rank(block: SparseMoeBlock, rank: int, num_local: int) -> None:
    """Make every token's top experts those of `rank` (inputs are positive, see _steps)."""
    weight = block.gate.weight.data
    weight.abs_()
    others = torch.ones(NUM_EXPERTS, dtype=torch.bool)
    others[rank * num_local : (rank + 1) * num_local] = False
    weight[others] *= -1


def _steps() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    return {
        f"{n} tokens": torch.randn(n, HIDDEN, generator=generator) for n in (1, 2, 7, 33)
    } | {"positive": torch.rand(9, HIDDEN, generator=generator) + 0.1}


def _run_rank(rank: int, init_file: str, results: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=NUM_RANKS
    )
    try:
        tp = TensorParallel(rank, NUM_RANKS, dist.group.WORLD, expert_parallel=True)
        steps = _steps()
        outputs: dict[str, torch.Tensor] = {}
        block = _block(tp, TOP_K)
        for form in DISPATCH_FORMS:
            block.dispatch = forced_table(form)
            for name, hidden in steps.items():
                if name != "positive":
                    outputs[f"{form} {name}"] = block(hidden.clone())
        for target in range(NUM_RANKS):
            one_rank = _block(tp, ONE_RANK_TOP_K)
            _onto_rank(one_rank, target, NUM_EXPERTS // NUM_RANKS)
            one_rank.dispatch = forced_table(ALLTOALL)
            outputs[f"alltoall onto rank {target}"] = one_rank(steps["positive"].clone())
        from ladle.worker.expert_dispatch_setup import measure_dispatch

        counts, before = block.expert_token_counts.clone(), block.dispatch
        table = measure_dispatch(block, tp, [1, 16, 40], torch.float32)
        results[rank] = {
            "outputs": outputs,
            "table": table,
            "counts_kept": torch.equal(counts, block.expert_token_counts),
            "dispatch_kept": block.dispatch is before,
        }
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks() -> dict:
    """Both ranks' outputs, run once for the module (one spawn: a few seconds)."""
    with tempfile.TemporaryDirectory() as folder:
        manager = mp.Manager()
        results = manager.dict()
        mp.spawn(_run_rank, args=(f"{folder}/init", results), nprocs=NUM_RANKS)
        return dict(results)


def _reference(top_k: int, hidden: torch.Tensor, onto: int | None = None) -> torch.Tensor:
    block = _block(TensorParallel(), top_k)
    if onto is not None:
        _onto_rank(block, onto, NUM_EXPERTS // NUM_RANKS)
    return block(hidden.clone())


@pytest.mark.parametrize("form", DISPATCH_FORMS)
@pytest.mark.parametrize("step", ["1 tokens", "2 tokens", "7 tokens", "33 tokens"])
def test_each_form_gives_the_single_process_layer(two_ranks, form, step):
    # 1 token on 2 ranks: rank 1's slice is empty (it sends nothing, yet receives and returns).
    expected = _reference(TOP_K, _steps()[step])
    for rank in range(NUM_RANKS):
        got = two_ranks[rank]["outputs"][f"{form} {step}"]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", range(NUM_RANKS))
def test_alltoall_when_every_token_goes_to_one_rank(two_ranks, target):
    expected = _reference(ONE_RANK_TOP_K, _steps()["positive"], onto=target)
    assert expected.abs().sum() > 0
    for rank in range(NUM_RANKS):
        got = two_ranks[rank]["outputs"][f"alltoall onto rank {target}"]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_auto_takes_the_same_implemented_form_on_every_rank(two_ranks):
    tables: list[DispatchTable] = [two_ranks[rank]["table"] for rank in range(NUM_RANKS)]
    assert tables[0] == tables[1]  # times max-reduced over ranks: one table
    table = tables[0]
    assert table.sizes == (1, 16, 40)
    assert all(form in DISPATCH_FORMS for form in table.forms)
    for timing, form in zip(table.seconds, table.forms, strict=True):
        assert set(timing) == set(DISPATCH_FORMS) and all(s > 0 for s in timing.values())
        assert timing[form] == min(timing.values())
    assert all(two_ranks[rank]["counts_kept"] for rank in range(NUM_RANKS))
    assert all(two_ranks[rank]["dispatch_kept"] for rank in range(NUM_RANKS))


def test_table_serves_each_size_with_the_next_measured_size():
    table = DispatchTable((1, 16, 256), (ALLREDUCE, ALLTOALL, ALLREDUCE))
    assert [table.form_for(n) for n in (1, 2, 16, 17, 256, 8192)] == [
        ALLREDUCE, ALLTOALL, ALLTOALL, ALLREDUCE, ALLREDUCE, ALLREDUCE,
    ]  # fmt: skip
    assert "<= 16 tokens: alltoall" in table.describe()


def test_an_unknown_dispatch_is_refused_naming_the_field_and_flag():
    with pytest.raises(ValueError, match="expert_parallel_dispatch must be one of"):
        ParallelConfig(expert_parallel_dispatch="deepep")
    from ladle.cli.main import build_parser

    parser = build_parser()
    parser.exit_on_error = False
    with pytest.raises((SystemExit, argparse.ArgumentError)) as raised:
        parser.parse_args(["serve", "m", "--expert-parallel-dispatch", "deepep"])
    assert raised.type is not SystemExit or raised.value.code == 2
    args = build_parser().parse_args(["serve", "m", "--expert-parallel-dispatch", "alltoall"])
    assert args.expert_parallel_dispatch == "alltoall"
