"""worker/kv_peers.py: a pull copies exactly the named blocks of every layer, K and V, as bytes
(bf16 and fp8 alike), through the CPU path and through both GPU strategies (run here on CPU
tensors), and bad ids or a missing pool fail the operation alone."""

from __future__ import annotations

import pytest
import torch

from ladle.protocol.step import KV_PULL, KVOperation
from ladle.worker.kv_copier import block_runs
from ladle.worker.kv_peers import PeerPools, export_kv_pool, pull_gathered

SHAPE = (3, 2, 10, 4, 2, 8)  # layers, K/V, blocks, block size, heads, head dim
SOURCES, TARGETS = [2, 3, 4, 7, 1], [5, 6, 7, 1, 9]


def _expected(pool: torch.Tensor, local_before: torch.Tensor) -> torch.Tensor:
    expected = local_before.clone()
    expected[:, :, TARGETS] = pool[:, :, SOURCES]
    return expected


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_cpu_pull_through_shared_memory(dtype):
    pool, descriptor = export_kv_pool(SHAPE, dtype, torch.device("cpu"))
    pool.view(torch.uint8).random_(0, 255)
    local = torch.zeros(SHAPE, dtype=dtype)
    before = local.clone()
    peers = PeerPools()
    done, failed = peers.run(
        [KVOperation(KV_PULL, SOURCES, TARGETS, -1, descriptor)], list(local.unbind(0))
    )
    assert done == [-1] and not failed
    assert torch.equal(local.view(torch.uint8), _expected(pool, before).view(torch.uint8))
    # /metrics' pull counters: one pull of 5 blocks, every layer's K and V, as bytes.
    num_pulls, num_bytes, seconds = peers.take_stats()
    block_bytes = SHAPE[3] * SHAPE[4] * SHAPE[5] * pool.element_size()
    assert (num_pulls, num_bytes) == (1, len(SOURCES) * SHAPE[0] * 2 * block_bytes)
    assert seconds > 0 and peers.take_stats() == (0, 0, 0.0)


@pytest.mark.parametrize("strategy", ["kernel", "memcpy", "gathered"])
@pytest.mark.parametrize("stacked", [True, False])
def test_gpu_strategies_copy_the_same_bytes(strategy, stacked):
    """The GPU pull's forms (a copy per run in either strategy, or the gather that scattered
    blocks take), run on CPU tensors, move the same bytes."""
    as_bytes = (*SHAPE[:-1], 2 * SHAPE[-1])
    pool = torch.randint(0, 255, as_bytes, dtype=torch.uint8).view(torch.bfloat16)
    local = torch.zeros(SHAPE, dtype=torch.bfloat16)
    layers = list(local.unbind(0)) if stacked else [layer.clone() for layer in local.unbind(0)]
    before = local.clone()
    op = KVOperation(KV_PULL, SOURCES, TARGETS, -1, "")
    if strategy == "gathered":
        pull_gathered(op, pool.view(torch.uint8), layers, local if stacked else None)
    else:
        PeerPools(strategy)._pull_runs(block_runs(SOURCES, TARGETS), pool.view(torch.uint8),
                                       layers, local if stacked else None)  # fmt: skip
    got = torch.stack(layers)
    assert torch.equal(got.view(torch.uint8), _expected(pool, before).view(torch.uint8))


def test_bad_pulls_fail_alone():
    pool, descriptor = export_kv_pool(SHAPE, torch.float32, torch.device("cpu"))
    local = list(torch.zeros(SHAPE).unbind(0))
    operations = [
        KVOperation(KV_PULL, [99], [1], -1, descriptor),
        KVOperation(KV_PULL, [1], [1], -2, descriptor.replace("ladle-kv-", "ladle-kv-gone-")),
        KVOperation(KV_PULL, [1], [2], -3, descriptor),
    ]
    peers = PeerPools()
    done, failed = peers.run(operations, local)
    assert done == [-3]
    assert peers.take_stats()[0] == 1  # the failed ones are not counted as pulls
    assert "outside a pool" in failed[-1] and "gone" in failed[-2]
