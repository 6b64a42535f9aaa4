"""The worker's host-tier copies on the CPU (worker/kv_copier.py): block runs, every dtype's
bytes moved exactly (fp8 included), bad operations failing alone, against plain indexing."""

from __future__ import annotations

import pytest
import torch

from ladle.protocol.step import KV_LOAD, KV_STORE, KVOperation
from ladle.worker.host_kv_pool import allocate_host_kv_pool
from ladle.worker.kv_copier import KVCopier, block_runs

NUM_LAYERS, BLOCK_SHAPE = 3, (4, 2, 8)  # block_size, kv heads, head dim


def test_block_runs_join_pairs_consecutive_on_both_sides():
    assert block_runs([5, 6, 7, 2, 3, 9], [0, 1, 2, 3, 4, 8]) == [(5, 0, 3), (2, 3, 2), (9, 8, 1)]
    assert block_runs([], []) == []
    with pytest.raises(ValueError, match="as many target blocks"):
        block_runs([1, 2], [1])


def random_caches(num_blocks: int, dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(num_blocks)
    return [
        torch.randn((2, num_blocks, *BLOCK_SHAPE), generator=generator).to(dtype)
        for _ in range(NUM_LAYERS)
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_store_then_load_moves_every_byte(dtype):
    device_caches = random_caches(10, dtype)
    host_caches = allocate_host_kv_pool(NUM_LAYERS, 6, BLOCK_SHAPE, dtype, torch.device("cpu"))
    copier = KVCopier(host_caches, torch.device("cpu"))
    store = KVOperation(KV_STORE, [3, 4, 5, 8], [1, 2, 3, 0], op_id=1)
    assert copier.run([store], device_caches) == ([1], {})
    for device, host in zip(device_caches, host_caches):
        assert torch.equal(host[:, [1, 2, 3, 0]].view(torch.uint8),
                           device[:, [3, 4, 5, 8]].view(torch.uint8))
    before = [cache.clone() for cache in device_caches]
    load = KVOperation(KV_LOAD, [0, 3], [1, 9], op_id=2)
    assert copier.run([load], device_caches) == ([2], {})
    for device, original in zip(device_caches, before):
        assert torch.equal(device[:, [1, 9]].view(torch.uint8),
                           original[:, [8, 5]].view(torch.uint8))
        untouched = [b for b in range(10) if b not in (1, 9)]
        assert torch.equal(device[:, untouched].view(torch.uint8),
                           original[:, untouched].view(torch.uint8))
    stats = copier.take_stats()
    block_bytes = NUM_LAYERS * 2 * 4 * 2 * 8 * device_caches[0].element_size()
    assert (stats.bytes_to_host, stats.bytes_to_device) == (4 * block_bytes, 2 * block_bytes)
    assert copier.take_stats() is None  # counted once


def test_a_bad_operation_fails_alone_and_copies_nothing():
    device_caches = random_caches(6, torch.float32)
    host_caches = allocate_host_kv_pool(NUM_LAYERS, 4, BLOCK_SHAPE, torch.float32,
                                        torch.device("cpu"))
    copier = KVCopier(host_caches, torch.device("cpu"))
    host_before = [cache.clone() for cache in host_caches]
    operations = [
        KVOperation(KV_STORE, [1, 2], [0, 4], op_id=1),  # host block 4 does not exist
        KVOperation(KV_LOAD, [0], [0], op_id=2),  # the null block is never a load's target
        KVOperation("swap", [1], [1], op_id=3),
        KVOperation(KV_STORE, [5], [3], op_id=4),
    ]
    done, failed = copier.run(operations, device_caches)
    assert done == [4]
    assert "target_block_ids" in failed[1] and "null block" in failed[2]
    assert "not store or load" in failed[3]
    for host, before, device in zip(host_caches, host_before, device_caches):
        assert torch.equal(host[:, :3], before[:, :3])  # op 1 wrote nothing
        assert torch.equal(host[:, 3], device[:, 5])
