"""The fused Triton kernels (kernels/{rms_norm,rotary,activation,gumbel_sample,sampled_logprob}.py)
against the torch code they replace, at awkward sizes: rows 1, 7, a block, a block + 1 and long;
hidden sizes that are not powers of two; strided views as the model passes them; and inside a
CUDA graph.

The torch reference is each layer's own CPU-path code, run on the same device with the fused
kernels switched off (ladle.kernels.dispatch.set_fused_kernels).
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ROWS = [1, 7, 16, 17, 1000]


@contextlib.contextmanager
def fused(enabled: bool):
    from ladle.kernels.dispatch import set_fused_kernels

    previous = set_fused_kernels(enabled)
    try:
        yield
    finally:
        set_fused_kernels(previous)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert torch.isfinite(actual).all()
    expected = expected.double()
    return ((actual.double() - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def split_qkv(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int):
    """(query, key, value): [tokens, heads, head_dim] views of a merged qkv output."""
    num_tokens = qkv.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    query = qkv[:, :q_size].view(num_tokens, num_heads, head_dim)
    key = qkv[:, q_size : q_size + kv_size].view(num_tokens, num_kv_heads, head_dim)
    value = qkv[:, q_size + kv_size :].view(num_tokens, num_kv_heads, head_dim)
    return query, key, value


def make_norm(hidden: int, dtype: torch.dtype, generator: torch.Generator):
    from ladle.model.layers.norm import RMSNorm

    norm = RMSNorm(hidden, eps=1e-6).to("cuda")
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(hidden, generator=generator, device="cuda"))
    return norm.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("hidden", [64, 896, 4096])
@pytest.mark.parametrize("num_rows", ROWS)
def test_rms_norm_with_and_without_residual(num_rows, hidden, dtype):
    generator = torch.Generator(device="cuda").manual_seed(num_rows * 7919 + hidden)
    norm = make_norm(hidden, dtype, generator)
    x = torch.randn(num_rows, hidden, generator=generator, device="cuda").to(dtype) * 3
    residual = torch.randn(num_rows, hidden, generator=generator, device="cuda").to(dtype)

    with fused(False):
        expected_plain = norm(x)
        expected_out, expected_residual = norm(x, residual.clone())
    with fused(True):
        actual_plain = norm(x)
        new_residual = residual.clone()
        actual_out, returned_residual = norm(x, new_residual)

    tolerance = 1e-2 if dtype != torch.float32 else 1e-5
    assert relative_error(actual_plain, expected_plain) < tolerance
    assert relative_error(actual_out, expected_out) < tolerance
    # The sum is one rounded add: bit-identical, and written into the caller's residual.
    assert returned_residual is new_residual
    assert torch.equal(new_residual, expected_residual)
    assert actual_out.dtype == expected_out.dtype and actual_out.shape == expected_out.shape


@pytest.mark.parametrize("num_tokens", ROWS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_per_head_norm_on_a_strided_qkv_view(num_tokens, head_dim):
    """Qwen3's q/k norm: normalise each head of a view into the merged qkv output, no copy."""
    generator = torch.Generator(device="cuda").manual_seed(num_tokens + head_dim)
    num_heads, num_kv_heads = 16, 8
    norm = make_norm(head_dim, torch.bfloat16, generator)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_tokens, width, generator=generator, device="cuda").bfloat16()
    key = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
    key = key.view(num_tokens, num_kv_heads, head_dim)
    before = qkv.clone()
    with fused(False):
        expected = norm(key)
    with fused(True):
        actual = norm(key)
    assert actual.shape == expected.shape
    assert relative_error(actual, expected) < 1e-2
    assert torch.equal(qkv, before)  # the input view is left alone


@pytest.mark.parametrize("num_tokens", ROWS)
@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_dim", [(16, 8, 128), (14, 2, 64), (32, 8, 128), (12, 4, 96)]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rotary_in_place_matches_torch(num_tokens, num_heads, num_kv_heads, head_dim, dtype):
    from ladle.model.layers.rotary import RotaryEmbedding

    generator = torch.Generator(device="cuda").manual_seed(num_tokens * 31 + head_dim)
    with torch.device("cuda"):
        rotary = RotaryEmbedding(head_dim, 40960, 1e6).to(dtype)
    positions = torch.randint(0, 40960, (num_tokens,), generator=generator, device="cuda")
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_tokens, width, generator=generator, device="cuda").to(dtype)
    query = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    key = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
    key = key.view(num_tokens, num_kv_heads, head_dim)
    value_before = qkv[:, (num_heads + num_kv_heads) * head_dim :].clone()

    with fused(False):
        expected_query, expected_key = rotary(positions, query.clone(), key.clone())
    with fused(True):
        actual_query, actual_key = rotary(positions, query, key)

    # Each product and sum rounded as the eager ops round them: bit-identical.
    assert torch.equal(actual_query, expected_query)
    assert torch.equal(actual_key, expected_key)
    assert actual_query.data_ptr() == query.data_ptr()  # in place
    assert torch.equal(qkv[:, (num_heads + num_kv_heads) * head_dim :], value_before)


@pytest.mark.parametrize("num_tokens", [1, 7, 300])
@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_dim", [(32, 8, 128), (14, 2, 64), (12, 3, 96)]
)
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_rotary_with_cache_write_equals_rotary_then_reshape_and_cache(
    num_tokens, num_heads, num_kv_heads, head_dim, cache_dtype
):
    """The rotary launch that also writes the cache (what the model runs on CUDA) leaves the
    same query, key and cache bytes as the rotary launch followed by reshape_and_cache (bf16 and
    float8 caches, strided qkv views, padding slots < 0 that write nothing)."""
    from ladle.kernels.reshape_and_cache import reshape_and_cache
    from ladle.model.layers.attention import Attention
    from ladle.model.layers.rotary import RotaryEmbedding

    dtype = torch.bfloat16
    generator = torch.Generator(device="cuda").manual_seed(num_tokens * 7 + head_dim)
    with torch.device("cuda"):
        rotary = RotaryEmbedding(head_dim, 8192, 5e5).to(dtype)
    positions = torch.randint(0, 8192, (num_tokens,), generator=generator, device="cuda")
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size, generator=generator, device="cuda")
    qkv = (qkv * 4).to(dtype)
    block_size, num_blocks = 16, 64
    slots = torch.randperm(num_blocks * block_size, generator=generator, device="cuda")
    slots = slots[:num_tokens].clone()
    slots[::5] = -1  # padding rows of a CUDA graph bucket
    cache = torch.randn(
        2, num_blocks, block_size, num_kv_heads, head_dim, generator=generator, device="cuda"
    ).to(cache_dtype)
    kv_scales = None
    if cache_dtype == torch.float8_e4m3fn:
        kv_scales = (
            torch.tensor([0.02], device="cuda"),
            torch.tensor([0.015], device="cuda"),  # some values saturate at 448
        )

    def split(tensor):
        return split_qkv(tensor, num_heads, num_kv_heads, head_dim)

    with fused(True):
        expected_qkv, expected_cache = qkv.clone(), cache.clone()
        query, key, value = split(expected_qkv)
        rotary(positions, query, key)
        k_scale, v_scale = kv_scales if kv_scales is not None else (None, None)
        reshape_and_cache(key, value, expected_cache, slots, k_scale, v_scale)

        actual_qkv, actual_cache = qkv.clone(), cache.clone()
        query, key, value = split(actual_qkv)
        attention = Attention(num_heads, num_kv_heads, head_dim, head_dim**-0.5, backend=None)
        attention = attention.cuda()
        if kv_scales is not None:
            attention.k_scale, attention.v_scale = kv_scales
        metadata = SimpleNamespace(slot_mapping=slots)  # all that the cache write reads
        assert attention.rotate_and_cache_(
            rotary, positions, query, key, value, actual_cache, metadata
        )

    assert torch.equal(actual_qkv, expected_qkv)  # query and key rotated in place alike
    assert torch.equal(actual_cache.view(torch.uint8), expected_cache.view(torch.uint8))
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool, device="cuda")
    untouched[slots[slots >= 0]] = False
    flat_cache = actual_cache.view(torch.uint8).view(2, num_blocks * block_size, -1)
    original = cache.view(torch.uint8).view(2, num_blocks * block_size, -1)
    assert torch.equal(flat_cache[:, untouched], original[:, untouched])


@pytest.mark.parametrize("num_tokens", [1, 7, 300])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(16, 8, 128), (14, 2, 64), (5, 1, 96)])
@pytest.mark.parametrize("write_cache", [False, True])
def test_rotary_with_qk_norm_equals_the_norms_then_rotary(
    num_tokens, num_heads, num_kv_heads, head_dim, write_cache
):
    """Qwen3's per-head q/k norms inside the rotary launch leave the query, key (and cache)
    that the two norm launches followed by the rotary launch leave, on strided views of qkv.
    The variance sums in another order, so a normalised element may round the other way: a few
    elements (under 1%) may differ, each by at most one bf16 unit in the last place of a
    normalised value of magnitude up to 4 (the weights are about 1) carried through the
    rotation; values stay untouched."""
    from ladle.kernels.reshape_and_cache import reshape_and_cache
    from ladle.kernels.rotary import QKNorm, rotary_embedding_

    dtype = torch.bfloat16
    generator = torch.Generator(device="cuda").manual_seed(num_tokens * 7 + head_dim)
    with torch.device("cuda"):
        from ladle.model.layers.rotary import RotaryEmbedding

        rotary = RotaryEmbedding(head_dim, 8192, 1e6).to(dtype)
    query_norm = make_norm(head_dim, dtype, generator)
    key_norm = make_norm(head_dim, dtype, generator)
    positions = torch.randint(0, 8192, (num_tokens,), generator=generator, device="cuda")
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = (torch.randn(num_tokens, q_size + 2 * kv_size, generator=generator, device="cuda") * 4)
    qkv = qkv.to(dtype)
    cache = torch.zeros(2, 32, 16, num_kv_heads, head_dim, device="cuda", dtype=dtype)
    slots = torch.randperm(32 * 16, generator=generator, device="cuda")[:num_tokens].clone()

    def split(tensor):
        return split_qkv(tensor, num_heads, num_kv_heads, head_dim)

    with fused(True):
        expected_qkv, expected_cache = qkv.clone(), cache.clone()
        query, key, value = split(expected_qkv)
        query, key = query_norm(query), key_norm(key)
        rotary_embedding_(positions, query, key, rotary.cos_sin_cache)
        if write_cache:
            reshape_and_cache(key, value, expected_cache, slots)
        expected_query, expected_key = query, key

        actual_qkv, actual_cache = qkv.clone(), cache.clone()
        query, key, value = split(actual_qkv)
        norms = rotary.may_norm_heads(query, key, query_norm, key_norm)
        assert norms == QKNorm(query_norm.weight, key_norm.weight, query_norm.eps)
        if write_cache:
            rotary_embedding_(positions, query, key, rotary.cos_sin_cache, value, actual_cache,
                              slots, qk_norm=norms)  # fmt: skip
        else:
            rotary_embedding_(positions, query, key, rotary.cos_sin_cache, qk_norm=norms)

    for actual, expected in ((query, expected_query), (key, expected_key)):
        differ = actual != expected
        assert differ.float().mean().item() < 0.01
        assert (actual.float() - expected.float()).abs().max().item() <= 2 * 4 * 2**-7
    if write_cache:
        differ = actual_cache != expected_cache
        assert differ.float().mean().item() < 0.01
    assert torch.equal(actual_qkv[:, q_size + kv_size :], qkv[:, q_size + kv_size :])


@pytest.mark.parametrize("num_rows", ROWS)
@pytest.mark.parametrize("width", [1, 7, 1024, 1025, 4864])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_silu_and_mul(num_rows, width, dtype):
    from ladle.model.layers.activation import SiluAndMul

    generator = torch.Generator(device="cuda").manual_seed(num_rows * 13 + width)
    x = torch.randn(num_rows, 2 * width, generator=generator, device="cuda").to(dtype) * 4
    layer = SiluAndMul()
    with fused(False):
        expected = layer(x)
    with fused(True):
        actual = layer(x)
    assert actual.shape == expected.shape
    assert relative_error(actual, expected) < (1e-2 if dtype == torch.bfloat16 else 1e-6)
    # Same formula and rounding as torch's kernel: at most a rare last-bit difference.
    mismatched = (actual != expected).float().mean().item()
    assert mismatched < 1e-3


@pytest.mark.parametrize("num_reqs", [1, 7, 64, 65])
@pytest.mark.parametrize("vocab_size", [1, 7, 2048, 2049, 151936])
def test_gumbel_noise_and_draw_are_bit_identical(num_reqs, vocab_size):
    from ladle.kernels.gumbel_sample import gumbel_argmax
    from ladle.sample.rng import counter_gumbels

    generator = torch.Generator(device="cuda").manual_seed(num_reqs * 3 + vocab_size)
    seeds = torch.randint(0, 2**63 - 1, (num_reqs,), generator=generator, device="cuda")
    steps = torch.randint(0, 100_000, (num_reqs,), generator=generator, device="cuda")
    logits = torch.randn(num_reqs, vocab_size, generator=generator, device="cuda") * 4
    temperature = torch.rand(num_reqs, generator=generator, device="cuda") + 0.1
    noise = torch.full((num_reqs, vocab_size), float("nan"), device="cuda")

    ids = gumbel_argmax(logits, seeds, steps, temperature, noise=noise)

    expected_noise = counter_gumbels(seeds, steps, vocab_size)
    assert torch.equal(noise, expected_noise)
    expected_ids = (logits / temperature[:, None] + expected_noise).argmax(dim=-1)
    assert torch.equal(ids, expected_ids)


def test_gumbel_draw_ties_and_masked_rows_follow_torch_argmax():
    from ladle.kernels.gumbel_sample import gumbel_argmax
    from ladle.sample.rng import counter_gumbels

    logits = torch.zeros(3, 5000, device="cuda")
    logits[0] = float("-inf")  # nothing allowed: torch.argmax says 0
    logits[1, 4000:] = float("-inf")
    logits[2, :] = float("-inf")
    logits[2, 4097] = 1.0
    seeds = torch.tensor([1, 2, 3], device="cuda")
    steps = torch.tensor([0, 5, 9], device="cuda")
    expected = (logits + counter_gumbels(seeds, steps, 5000)).argmax(dim=-1)
    assert torch.equal(gumbel_argmax(logits, seeds, steps), expected)
    assert expected[2].item() == 4097


@pytest.mark.parametrize("num_reqs,vocab_size", [(1, 128256), (1, 151936), (3, 5000), (64, 32000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_argmax_is_torch_argmax(num_reqs, vocab_size, dtype):
    """The split argmax picks torch's token: ties (bfloat16 logits tie often) go to the lowest
    id, across chunk borders too; a row of -inf gives 0; a winner in the last partial chunk."""
    from ladle.kernels.gumbel_sample import greedy_argmax

    generator = torch.Generator(device="cuda").manual_seed(vocab_size + num_reqs)
    logits = torch.randn(num_reqs, vocab_size, device="cuda", generator=generator).to(dtype)
    # A tie: across the 8192-token chunks for the large vocabularies, inside one for 5000.
    logits[0, 100] = logits[0, vocab_size - 2] = logits[0].max() + 1
    if num_reqs > 1:
        logits[1] = float("-inf")
        logits[2, vocab_size - 1] = 1e4  # the last token wins
    assert torch.equal(greedy_argmax(logits), logits.argmax(dim=-1))
    assert greedy_argmax(logits)[0].item() == 100


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=0.6),
        dict(temperature=1.0, top_k=50),
        dict(temperature=0.8, top_k=1),
        dict(temperature=0.7, top_p=0.9),
        dict(temperature=0.7, top_k=20, top_p=0.8),
        dict(temperature=1.2, min_p=0.05),
        dict(temperature=0.9, presence_penalty=0.5, repetition_penalty=1.2),
    ],
    ids=lambda params: ",".join(f"{k}={v}" for k, v in params.items()),
)
@pytest.mark.parametrize("num_reqs", [1, 7, 65])
@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
def test_sampler_tokens_identical_with_fused_kernels(params, num_reqs, logits_dtype):
    """Seeded and greedy rows give the same tokens with the fused kernels on and off, also from
    the model's bf16 logits, which the fused draw reads without a float32 copy."""
    from ladle import SamplingParams
    from ladle.sample.metadata import build_sampling_metadata
    from ladle.sample.sampler import Sampler

    vocab_size = 32000
    generator = torch.Generator(device="cuda").manual_seed(num_reqs)
    logits = (torch.randn(num_reqs, vocab_size, generator=generator, device="cuda") * 3).bfloat16()
    logits = logits.to(logits_dtype)  # bf16-valued logits tie often, as a real lm_head's do
    sampling = [
        SamplingParams(**(params if row % 3 else {"temperature": 0.0}), seed=row)
        for row in range(num_reqs)
    ]
    prompts = [[row, row + 1, 7] for row in range(num_reqs)]
    outputs = [[row * 5 % vocab_size] for row in range(num_reqs)]
    metadata = build_sampling_metadata(
        sampling,
        seeds=list(range(100, 100 + num_reqs)),
        num_output_tokens=[1] * num_reqs,
        vocab_size=vocab_size,
        prompt_token_ids=prompts,
        output_token_ids=outputs,
        device="cuda",
    )
    sampler = Sampler()
    before = logits.clone()
    with fused(False):
        expected = sampler(logits, metadata).sampled_token_ids
    with fused(True):
        actual = sampler(logits, metadata).sampled_token_ids
    assert torch.equal(actual, expected)
    assert torch.equal(logits, before)  # the caller's logits are never changed


@pytest.mark.parametrize("num_reqs,vocab_size", [(1, 151936), (1, 128256), (3, 8193), (7, 5000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampled_logprob_and_rank_match_the_torch_path(num_reqs, vocab_size, dtype):
    """kernels/sampled_logprob.py (`logprobs: 0`) against the torch path (float32 log-softmax,
    gather, strictly-greater count): the same ranks, the logprob within float32 rounding of a
    long sum (both against float64), ties sharing the best rank."""
    from ladle.kernels.sampled_logprob import sampled_logprob_and_rank
    from ladle.sample.logprobs import gather_logprobs

    generator = torch.Generator(device="cuda").manual_seed(vocab_size + num_reqs)
    logits = (torch.randn(num_reqs, vocab_size, device="cuda", generator=generator) * 4).to(dtype)
    sampled = torch.randint(0, vocab_size, (num_reqs,), device="cuda", generator=generator)
    logits[0, 10] = logits[0, vocab_size - 3] = logits[0].max() + 1  # a tie across chunks
    sampled[0] = vocab_size - 3
    token_ids, logprobs, ranks = sampled_logprob_and_rank(logits, sampled)
    expected_ids, expected_logprobs, expected_ranks = gather_logprobs(
        torch.log_softmax(logits.float(), dim=-1), sampled, 0
    )
    exact = torch.log_softmax(logits.double(), dim=-1).gather(1, sampled[:, None].long())
    assert torch.equal(token_ids, expected_ids)
    assert torch.equal(ranks, expected_ranks) and ranks[0].item() == 1
    torch.testing.assert_close(logprobs, expected_logprobs, rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(logprobs.double(), exact, rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_reqs", [1, 7])
def test_sampler_sampled_logprob_alone_leaves_tokens_and_matches_the_torch_path(
    num_reqs, logits_dtype
):
    """logprobs=0 on CUDA takes kernels/sampled_logprob.py, not a float32 copy and a full
    log-softmax: the seeded tokens are those of the torch path, the ranks too, the logprobs
    within float32 rounding; penalised rows report the raw distribution's."""
    from ladle import SamplingParams
    from ladle.sample.metadata import build_sampling_metadata
    from ladle.sample.sampler import Sampler

    vocab_size = 151936
    generator = torch.Generator(device="cuda").manual_seed(num_reqs)
    logits = (torch.randn(num_reqs, vocab_size, generator=generator, device="cuda") * 3).bfloat16()
    logits = logits.to(logits_dtype)
    sampling = [
        SamplingParams(
            temperature=(0.6, 0.0, 1.0)[row % 3], seed=row, logprobs=0,
            repetition_penalty=1.3 if row == 2 else 1.0,
        )
        for row in range(num_reqs)
    ]
    metadata = build_sampling_metadata(
        sampling, seeds=list(range(num_reqs)), num_output_tokens=[3] * num_reqs,
        vocab_size=vocab_size, prompt_token_ids=[[row, 7] for row in range(num_reqs)],
        output_token_ids=[[row * 5] for row in range(num_reqs)], device="cuda",
    )
    before = logits.clone()
    with fused(False):
        expected = Sampler()(logits, metadata)
    with fused(True):
        actual = Sampler()(logits, metadata)
    assert torch.equal(logits, before)
    assert torch.equal(actual.sampled_token_ids, expected.sampled_token_ids)
    assert torch.equal(actual.logprob_token_ids, expected.logprob_token_ids)
    assert torch.equal(actual.sampled_ranks, expected.sampled_ranks)
    torch.testing.assert_close(actual.logprobs, expected.logprobs, rtol=1e-6, atol=2e-6)


def test_kernels_replay_in_a_cuda_graph():
    """No host syncs or data-dependent allocations: capture once, replay on new data."""
    from ladle.kernels.activation import silu_and_mul
    from ladle.kernels.gumbel_sample import gumbel_argmax
    from ladle.kernels.rms_norm import rms_norm
    from ladle.kernels.rotary import rotary_embedding_
    from ladle.model.layers.rotary import RotaryEmbedding

    num_tokens, hidden, heads, head_dim, vocab = 17, 896, 14, 64, 3000
    with torch.device("cuda"):
        rotary = RotaryEmbedding(head_dim, 4096, 1e4).bfloat16()
        weight = torch.rand(hidden).bfloat16() + 0.5
        x = torch.randn(num_tokens, hidden).bfloat16()
        residual = torch.randn(num_tokens, hidden).bfloat16()
        qk = torch.randn(num_tokens, 2 * heads, head_dim).bfloat16()
        positions = torch.randint(0, 4096, (num_tokens,))
        gate_up = torch.randn(num_tokens, 2 * hidden).bfloat16()
        logits = torch.randn(num_tokens, vocab)
        seeds = torch.randint(0, 2**31, (num_tokens,))
        steps = torch.zeros(num_tokens, dtype=torch.int64)

    def step():
        normed = rms_norm(x, weight, 1e-6, residual=residual)
        rotary_embedding_(positions, qk[:, :heads], qk[:, heads:], rotary.cos_sin_cache)
        return normed, silu_and_mul(gate_up), gumbel_argmax(logits, seeds, steps)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_outputs = step()

    for _ in range(2):
        for tensor in (x, residual, qk, gate_up, logits):
            tensor.copy_(torch.randn_like(tensor))
        positions.random_(0, 4096)
        seeds.random_(0, 2**31)
        steps.add_(1)
        saved = (residual.clone(), qk.clone())
        graph.replay()
        replayed = [t.clone() for t in graph_outputs] + [residual.clone(), qk.clone()]
        residual.copy_(saved[0])
        qk.copy_(saved[1])
        eager = list(step()) + [residual, qk]
        for got, want in zip(replayed, eager, strict=True):
            assert torch.equal(got, want)


@pytest.mark.parametrize("num_reqs", [1, 7, 65])
@pytest.mark.parametrize("vocab_size", [7, 2049, 151936])
@pytest.mark.parametrize("width", [1, 17, 1000])
def test_penalties_are_bit_identical(num_reqs, vocab_size, width):
    from ladle.kernels.penalties import apply_penalties_ as fused_penalties_
    from ladle.sample.penalties import apply_penalties_

    generator = torch.Generator(device="cuda").manual_seed(num_reqs * 7 + vocab_size + width)

    def padded_ids():
        # Ids with repeats, rows padded (with vocab_size) to different lengths.
        ids = torch.randint(0, vocab_size, (num_reqs, width), generator=generator, device="cuda")
        lengths = torch.randint(0, width + 1, (num_reqs, 1), generator=generator, device="cuda")
        columns = torch.arange(width, device="cuda")[None, :]
        return torch.where(columns < lengths, ids, vocab_size)

    prompt_ids, output_ids = padded_ids(), padded_ids()
    logits = torch.randn(num_reqs, vocab_size, generator=generator, device="cuda") * 3
    presence = torch.rand(num_reqs, generator=generator, device="cuda") * 4 - 2
    frequency = torch.rand(num_reqs, generator=generator, device="cuda") * 4 - 2
    repetition = torch.rand(num_reqs, generator=generator, device="cuda") * 1.9 + 0.1
    presence[0], frequency[0], repetition[0] = 0.0, 0.0, 1.0  # a neutral row stays bit-identical

    expected = apply_penalties_(
        logits.clone(), prompt_ids, output_ids, presence, frequency, repetition
    )
    actual = fused_penalties_(
        logits.clone(), prompt_ids, output_ids, presence, frequency, repetition
    )
    assert torch.equal(actual, expected)
    assert torch.equal(actual[0], logits[0])
