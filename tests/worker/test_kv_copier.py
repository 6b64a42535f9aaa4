"""The worker's host-tier copies on the CPU (worker/kv_copier.py): block runs, every dtype's
bytes moved exactly (fp8 included) for stacked and separate layer caches, bad operations
failing alone; against plain per-layer indexing."""

from __future__ import annotations

import pytest
import torch

from ladle.protocol.step import KV_LOAD, KV_STORE, KVOperation
from ladle.worker.host_kv_pool import allocate_host_kv_pool
from ladle.worker.kv_copier import KVCopier, block_runs, stacked_layers

NUM_LAYERS, BLOCK_SHAPE = 3, (4, 2, 8)  # block_size, kv heads, head dim
CPU = torch.device("cpu")


def test_block_runs_join_pairs_consecutive_on_both_sides():
    assert block_runs([5, 6, 7, 2, 3, 9], [0, 1, 2, 3, 4, 8]) == [(5, 0, 3), (2, 3, 2), (9, 8, 1)]
    assert block_runs([], []) == []
    with pytest.raises(ValueError, match="as many target blocks"):
        block_runs([1, 2], [1])


def random_caches(num_blocks: int, dtype: torch.dtype, stacked: bool) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(num_blocks)
    shape = (NUM_LAYERS, 2, num_blocks, *BLOCK_SHAPE)
    values = torch.randn(shape, generator=generator).to(dtype)
    if stacked:
        return list(values.unbind(0))
    return [layer.clone() for layer in values.unbind(0)]


def test_stacked_layers_sees_one_allocation_only():
    together = random_caches(5, torch.float32, stacked=True)
    view = stacked_layers(together)
    assert view is not None and view.shape == (NUM_LAYERS, 2, 5, *BLOCK_SHAPE)
    assert torch.equal(view[1], together[1])
    assert stacked_layers(random_caches(5, torch.float32, stacked=False)) is None


@pytest.mark.parametrize("stacked", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_store_then_load_moves_every_byte(dtype, stacked):
    device_caches = random_caches(10, dtype, stacked)
    host_pool = allocate_host_kv_pool(NUM_LAYERS, 6, BLOCK_SHAPE, dtype, CPU)
    assert host_pool.shape == (6, NUM_LAYERS, 2, *BLOCK_SHAPE)
    copier = KVCopier(host_pool, CPU)
    store = KVOperation(KV_STORE, [3, 4, 5, 8], [1, 2, 3, 0], op_id=1)
    assert copier.run([store], device_caches) == ([1], {})
    host_bytes = host_pool.view(torch.uint8)
    for layer, device in enumerate(device_caches):
        device_bytes = device.view(torch.uint8)
        for source, target in zip([3, 4, 5, 8], [1, 2, 3, 0]):
            assert torch.equal(host_bytes[target, layer], device_bytes[:, source])
    before = [cache.view(torch.uint8).clone() for cache in device_caches]
    load = KVOperation(KV_LOAD, [0, 3], [1, 9], op_id=2)
    assert copier.run([load], device_caches) == ([2], {})
    for device, original in zip(device_caches, before):
        device_bytes = device.view(torch.uint8)
        assert torch.equal(device_bytes[:, 1], original[:, 8])
        assert torch.equal(device_bytes[:, 9], original[:, 5])
        untouched = [b for b in range(10) if b not in (1, 9)]
        assert torch.equal(device_bytes[:, untouched], original[:, untouched])
    stats = copier.take_stats()
    block_bytes = NUM_LAYERS * 2 * 4 * 2 * 8 * device_caches[0].element_size()
    assert (stats.bytes_to_host, stats.bytes_to_device) == (4 * block_bytes, 2 * block_bytes)
    assert 0 < stats.load_seconds < stats.copy_seconds
    assert copier.take_stats() is None  # counted once


def test_a_bad_operation_fails_alone_and_copies_nothing():
    device_caches = random_caches(6, torch.float32, stacked=True)
    host_pool = allocate_host_kv_pool(NUM_LAYERS, 4, BLOCK_SHAPE, torch.float32, CPU)
    copier = KVCopier(host_pool, CPU)
    host_before = host_pool.clone()
    operations = [
        KVOperation(KV_STORE, [1, 2], [0, 4], op_id=1),  # host block 4 does not exist
        KVOperation(KV_LOAD, [0], [0], op_id=2),  # the null block is never a load's target
        KVOperation("swap", [1], [1], op_id=3),
        KVOperation(KV_STORE, [1, 2], [0], op_id=5),
        KVOperation(KV_STORE, [5], [3], op_id=4),
    ]
    done, failed = copier.run(operations, device_caches)
    assert done == [4]
    assert "target_block_ids" in failed[1] and "null block" in failed[2]
    assert "not store or load" in failed[3] and "as many target blocks" in failed[5]
    assert torch.equal(host_pool[:3], host_before[:3])  # op 1 wrote nothing
    for layer, device in enumerate(device_caches):
        assert torch.equal(host_pool[3, layer], device[:, 5])


def test_the_byte_views_are_made_once_and_an_idle_copier_is_skippable():
    device_caches = random_caches(10, torch.float32, stacked=True)
    copier = KVCopier(allocate_host_kv_pool(NUM_LAYERS, 6, BLOCK_SHAPE, torch.float32, CPU), CPU)
    assert copier.is_idle
    first = copier._byte_views(device_caches)
    assert copier._byte_views(device_caches) is not None
    assert copier._byte_views(device_caches)[0] is first[0]  # not made again
    store = KVOperation(KV_STORE, [3], [1], op_id=1)
    assert copier.run([store], device_caches) == ([1], {})
    assert not copier.is_idle  # bytes to report
    assert copier.take_stats().bytes_to_host > 0
    assert copier.is_idle
    # Other caches (a new list): new views, checked against the host pool again.
    other = random_caches(10, torch.float32, stacked=False)
    assert copier._byte_views(other)[1] is None
    with pytest.raises(ValueError, match="block layout"):
        copier._byte_views(random_caches(10, torch.float32, stacked=True)[:2])


def test_copies_move_the_widest_words_the_head_allows():
    from ladle.worker.kv_copier import as_words

    assert as_words(torch.zeros((2, 4, 8), dtype=torch.bfloat16)).dtype == torch.int64
    assert as_words(torch.zeros((2, 4, 6), dtype=torch.float8_e4m3fn)).dtype == torch.int16
    assert as_words(torch.zeros((2, 4, 3), dtype=torch.uint8)).dtype == torch.uint8
    # An address that is not 8-aligned takes a narrower word.
    odd = torch.zeros(64, dtype=torch.bfloat16)[1:9].view(1, 8)
    assert as_words(odd).dtype == torch.int16
    pool = allocate_host_kv_pool(NUM_LAYERS, 6, BLOCK_SHAPE, torch.bfloat16, CPU)
    copier = KVCopier(pool, CPU)
    assert copier.host_pool.dtype == torch.int64
    assert copier.block_bytes == NUM_LAYERS * 2 * 4 * 2 * 8 * 2
