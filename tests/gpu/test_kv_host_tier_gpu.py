"""The KV cache's host tier on CUDA: the pinned pool and the side-stream copies for bf16 and fp8
caches (bytes equal to plain indexing, copies ordered behind earlier forwards and ahead of the
next), and the engine's greedy tokens with the tier on equal those with it off, graphs on and
off, with a device pool small enough that prefixes are evicted and loaded back."""

from __future__ import annotations

import random

import pytest
import torch

from ladle import LLM, SamplingParams
from ladle.protocol.step import KV_LOAD, KV_STORE, KVOperation
from ladle.worker.host_kv_pool import allocate_host_kv_pool
from ladle.worker.kv_copier import KVCopier, measure_copy_bandwidth

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

NUM_LAYERS, BLOCK_SHAPE = 4, (16, 8, 128)


@pytest.mark.parametrize("stacked", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_copies_on_the_side_stream_move_every_byte(dtype, stacked):
    device = torch.device("cuda")
    values = torch.randn((NUM_LAYERS, 2, 64, *BLOCK_SHAPE), device=device).to(dtype)
    layers = values.unbind(0) if stacked else [layer.clone() for layer in values.unbind(0)]
    device_caches = list(layers)
    host_pool = allocate_host_kv_pool(NUM_LAYERS, 32, BLOCK_SHAPE, dtype, device)
    assert host_pool.is_pinned()
    block_bytes = host_pool[0].numel() * host_pool.element_size()
    # A staging buffer of 3 blocks: the 7-block batches go through it in chunks.
    copier = KVCopier(host_pool, device, staging_bytes=3 * block_bytes)
    sources = [3, 4, 5, 6, 40, 41, 7]  # runs and a single block
    targets = [0, 1, 2, 3, 10, 11, 31]
    copier.wait_for_earlier_copies()
    done, failed = copier.run([KVOperation(KV_STORE, sources, targets, op_id=1)], device_caches)
    assert (done, failed) == ([1], {})
    # The next "step" overwrites the stored blocks; the copy must have read them first.
    copier.wait_for_earlier_copies()
    expected = [cache.view(torch.uint8)[:, sources].cpu() for cache in device_caches]
    for cache in device_caches:
        cache.view(torch.uint8)[:, sources] = 0
    torch.cuda.synchronize()
    host_bytes = host_pool.view(torch.uint8)
    for layer, reference in enumerate(expected):
        for position, target in enumerate(targets):
            assert torch.equal(host_bytes[target, layer], reference[:, position])
    # Load them back into other blocks; the following "forward" waits for the copy.
    load_targets = [50, 51, 52, 53, 60, 61, 1]
    copier.run([KVOperation(KV_LOAD, targets, load_targets, op_id=2)], device_caches)
    copier.wait_for_earlier_copies()
    # Read on the compute stream, which waited for the load.
    loaded = [cache.view(torch.uint8)[:, load_targets].cpu() for cache in device_caches]
    for got, reference in zip(loaded, expected):
        assert torch.equal(got, reference)
    torch.cuda.synchronize()
    stats = copier.take_stats()
    assert 0 < stats.load_seconds < stats.copy_seconds
    assert stats.bytes_to_host == stats.bytes_to_device == 7 * block_bytes


def test_pinned_copy_bandwidth_is_measured():
    bandwidth = measure_copy_bandwidth(torch.device("cuda"))
    assert 1e9 < bandwidth < 1e12  # PCIe or NVLink-C2C, bytes per second


GPU_SHAPE = dict(
    hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    intermediate_size=512,
)


def _conversations(llm: LLM) -> list[list[int]]:
    rng = random.Random(3)
    turns = [[[rng.randrange(4, 500) for _ in range(rng.randrange(40, 90))]
              for _ in range(3)] for _ in range(8)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    histories = [[] for _ in turns]
    replies = []
    for turn in range(3):
        prompts = [{"prompt_token_ids": h + c[turn]} for h, c in zip(histories, turns)]
        for index, output in enumerate(llm.generate(prompts, params, use_tqdm=False)):
            reply = list(output.outputs[0].token_ids)
            replies.append(reply)
            histories[index] = prompts[index]["prompt_token_ids"] + reply
    return replies


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from helpers.tiny_models import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tier"), "qwen3", **GPU_SHAPE))


@pytest.mark.parametrize(("kv_cache_dtype", "enforce_eager"), [("auto", False), ("fp8", True)])
def test_greedy_tokens_with_the_tier_on_equal_those_with_it_off(
    model_path, kv_cache_dtype, enforce_eager
):
    """One request at a time, so each request's steps have the same shapes in both runs (bf16
    GEMMs are not batch-invariant): without the tier a large pool keeps every history as device
    hits; with it, a 64-block pool (about three histories of the eight) evicts them and they
    come back from the host. Any byte a copy gets wrong changes the tokens."""
    options = dict(
        dtype="bfloat16", max_num_seqs=1, max_model_len=512, kv_cache_dtype=kv_cache_dtype,
        enforce_eager=enforce_eager, seed=0,
    )
    off = LLM(model_path, kv_offloading_size=0, num_kv_blocks=2048, **options)
    expected = _conversations(off)
    del off
    torch.cuda.empty_cache()
    on = LLM(model_path, kv_offloading_size=0.25, num_kv_blocks=65, **options)
    assert _conversations(on) == expected
    stats = on.engine.get_stats()
    assert stats.host_cache_hits > 0 and stats.kv_bytes_to_device > 0
    assert stats.num_free_blocks == stats.num_total_blocks and stats.host_kv_usage == 0.0


def test_a_store_before_the_forward_reads_the_blocks_before_that_forward_rewrites_them():
    # A store at eviction (core/kv_transfers.py): the same step hands its blocks out again, so
    # that step's forward, queued right after the copy is issued, must wait for it.
    device = torch.device("cuda")
    values = torch.randn((NUM_LAYERS, 2, 64, *BLOCK_SHAPE), device=device).to(torch.bfloat16)
    device_caches = list(values.unbind(0))
    host_pool = allocate_host_kv_pool(NUM_LAYERS, 32, BLOCK_SHAPE, torch.bfloat16, device)
    copier = KVCopier(host_pool, device)
    sources = list(range(1, 33))
    expected = [cache.view(torch.uint8)[:, sources].cpu() for cache in device_caches]
    torch.cuda.synchronize()
    # A long kernel on the compute stream first, so the copy starts late.
    busy = torch.randn(4096, 4096, device=device)
    for _ in range(20):
        busy = busy @ busy / 64
    copier.wait_for_earlier_copies()
    operation = KVOperation(KV_STORE, sources, list(range(32)), op_id=1, before_forward=True)
    assert copier.run([operation], device_caches) == ([1], {})
    for cache in device_caches:  # this step's "forward" rewrites the blocks at once
        cache.view(torch.uint8)[:, sources] = 0
    torch.cuda.synchronize()
    host_bytes = host_pool.view(torch.uint8)
    for layer, reference in enumerate(expected):
        for position in range(32):
            assert torch.equal(host_bytes[position, layer], reference[:, position])
