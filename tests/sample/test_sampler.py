"""Sampler behaviour: greedy, reproducibility, fast paths, fully masked rows, dtype and aliasing."""

import dataclasses

import torch

from ladle.sample import Sampler, SamplingMetadata, build_sampling_metadata
from ladle.sampling.params import SamplingParams

VOCAB = 1000


def _sample(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    return Sampler()(logits, metadata).sampled_token_ids


def _metadata(
    params: list[SamplingParams],
    seeds: list[int] | None = None,
    steps: list[int] | None = None,
    **kwargs,
) -> SamplingMetadata:
    seeds = seeds if seeds is not None else list(range(len(params)))
    steps = steps if steps is not None else [0] * len(params)
    return build_sampling_metadata(params, seeds, steps, vocab_size=VOCAB, **kwargs)


def test_greedy_is_exactly_argmax() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(16, VOCAB, generator=generator) * 3
    params = [SamplingParams(temperature=0.0, top_k=3, top_p=0.1, min_p=0.5)] * 16
    sampled = _sample(logits, _metadata(params))
    assert sampled.dtype == torch.int64
    assert torch.equal(sampled, logits.argmax(dim=-1))


def test_greedy_rows_in_a_mixed_batch_stay_argmax() -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(8, VOCAB, generator=generator)
    params = [SamplingParams(temperature=0.0 if row % 2 else 1.5, top_p=0.9) for row in range(8)]
    sampled = _sample(logits, _metadata(params))
    assert torch.equal(sampled[1::2], logits[1::2].argmax(dim=-1))
    assert not torch.equal(sampled[0::2], logits[0::2].argmax(dim=-1))  # flat-ish: draws differ


def test_same_seed_and_step_same_token_whatever_the_batch() -> None:
    generator = torch.Generator().manual_seed(2)
    num_reqs = 64
    logits = torch.randn(num_reqs, VOCAB, generator=generator)
    params = [SamplingParams(temperature=1.0, top_k=0 if r % 3 else 50) for r in range(num_reqs)]
    seeds = [1000 + 7 * r for r in range(num_reqs)]
    steps = [r % 5 for r in range(num_reqs)]
    alone = torch.cat(
        [
            _sample(
                logits[r : r + 1], _metadata(params[r : r + 1], seeds[r : r + 1], steps[r : r + 1])
            )
            for r in range(num_reqs)
        ]
    )

    # Reversed, and interleaved with requests that switch on every other processing step
    # (penalties, min_p, top_p, greedy, logprobs, min_tokens bans), so flags and paths differ.
    others = [
        SamplingParams(
            temperature=0.0,
            repetition_penalty=1.3,
            frequency_penalty=0.5,
            presence_penalty=0.2,
            logprobs=5,
            min_tokens=4,
        ),
        SamplingParams(temperature=0.5, min_p=0.1, top_p=0.5, seed=1),
    ] * (num_reqs // 2)
    order = list(reversed(range(num_reqs)))
    batch_params, batch_seeds, batch_steps, rows = [], [], [], []
    for r in order:
        batch_params += [params[r], others[r]]
        batch_seeds += [seeds[r], 99]
        batch_steps += [steps[r], 0]
        rows += [logits[r], -logits[r]]
    metadata = _metadata(
        batch_params,
        batch_seeds,
        batch_steps,
        prompt_token_ids=[[1, 2, 3]] * (2 * num_reqs),
        output_token_ids=[[4]] * (2 * num_reqs),
        eos_token_ids=[[7]] * (2 * num_reqs),
    )
    flags = metadata.flags
    assert not flags.no_penalties and not flags.no_top_p and not flags.no_min_p
    mixed = _sample(torch.stack(rows), metadata)[0::2]
    assert torch.equal(mixed, alone[order])


def test_different_seeds_and_steps_draw_differently() -> None:
    logits = torch.zeros(200, VOCAB)
    params = [SamplingParams()] * 200
    by_seed = _sample(logits, _metadata(params, seeds=list(range(200))))
    by_step = _sample(logits, _metadata(params, seeds=[5] * 200, steps=list(range(200))))
    # 200 uniform draws over 1000 tokens: ~181 distinct expected.
    assert torch.unique(by_seed).numel() > 160
    assert torch.unique(by_step).numel() > 160
    again = _sample(logits, _metadata(params, seeds=list(range(200))))
    assert torch.equal(by_seed, again)


def test_top_k_off_values_and_top_p_one_match_the_fast_path() -> None:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(300, VOCAB, generator=generator)
    seeds = list(range(300))
    baseline = _sample(logits, _metadata([SamplingParams()] * 300, seeds))
    for top_k in (-1, 0, VOCAB, VOCAB + 5):
        metadata = _metadata([SamplingParams(top_k=top_k)] * 300, seeds)
        assert metadata.flags.no_top_k == (top_k <= 0)
        assert torch.equal(_sample(logits, metadata), baseline), top_k
    # The slow path with neutral values must agree bit for bit with the fast path.
    forced = _metadata([SamplingParams(top_p=1.0)] * 300, seeds)
    assert forced.flags.no_top_p and forced.flags.no_top_k and forced.flags.no_min_p
    forced.flags = dataclasses.replace(forced.flags, no_top_k=False, no_top_p=False, no_min_p=False)
    assert torch.equal(_sample(logits, forced), baseline)


def test_a_single_unmasked_token_is_always_sampled() -> None:
    num_reqs = 2000
    logits = torch.full((num_reqs, VOCAB), float("-inf"))
    allowed = torch.arange(num_reqs) * 7 % VOCAB
    logits[torch.arange(num_reqs), allowed] = -50.0
    params = [
        SamplingParams(temperature=2.0),
        SamplingParams(temperature=0.3, top_k=3),
        SamplingParams(top_p=0.2, min_p=0.9),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, logprobs=3),
    ]
    metadata = _metadata([params[r % len(params)] for r in range(num_reqs)])
    output = Sampler()(logits, metadata)
    assert torch.equal(output.sampled_token_ids, allowed)
    assert torch.equal(output.logprobs[:, 0], torch.zeros(num_reqs))
    assert not bool(torch.isnan(output.logprobs).any())


def test_no_nan_or_masked_token_with_many_inf_logits() -> None:
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(500, VOCAB, generator=generator)
    logits[torch.rand(500, VOCAB, generator=generator) < 0.9] = float("-inf")
    logits[:, 0] = 0.0  # every row keeps one token
    params = [
        SamplingParams(
            temperature=0.8,
            top_p=0.95,
            min_p=0.01,
            top_k=40,
            logprobs=20,
            repetition_penalty=1.2,
            frequency_penalty=-0.5,
        )
    ] * 500
    metadata = _metadata(
        params, prompt_token_ids=[[0, 1, 2]] * 500, output_token_ids=[[3, 3]] * 500
    )
    output = Sampler()(logits, metadata)
    sampled = output.sampled_token_ids
    assert bool(torch.isfinite(logits.gather(1, sampled[:, None])).all())
    assert bool(torch.isfinite(output.logprobs[:, 0]).all())
    assert not bool(torch.isnan(output.logprobs).any())


def test_callers_logits_are_left_untouched() -> None:
    logits = torch.randn(4, VOCAB)
    before = logits.clone()
    params = [
        SamplingParams(
            temperature=0.7, top_p=0.9, min_p=0.05, top_k=10, presence_penalty=1.0, min_tokens=2
        )
    ] * 4
    metadata = _metadata(
        params, prompt_token_ids=[[1]] * 4, output_token_ids=[[2]] * 4, eos_token_ids=[[3]] * 4
    )
    _sample(logits, metadata)
    assert torch.equal(logits, before)


def test_half_precision_logits_are_sampled_in_float32() -> None:
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(32, VOCAB, generator=generator)
    params = [SamplingParams(temperature=0.9, top_p=0.9)] * 32
    from_bf16 = _sample(logits.bfloat16(), _metadata(params))
    from_fp32 = _sample(logits.bfloat16().float(), _metadata(params))
    assert torch.equal(from_bf16, from_fp32)


def test_empty_batch() -> None:
    metadata = _metadata([])
    assert _sample(torch.zeros(0, VOCAB), metadata).shape == (0,)


def test_top_k_by_selection_keeps_the_stable_sort_set():
    """top-k alone with max_top_k known skips the sort; ties at the k-th value go to the lowest
    ids as the stable sort orders them, -inf rows and disabled rows are handled alike."""
    from ladle.sample.truncation import apply_top_k_top_p_

    generator = torch.Generator().manual_seed(0)
    for trial in range(60):
        num_reqs = 1 + trial % 7
        vocab_size = 8 + 97 * trial
        logits = torch.randn(num_reqs, vocab_size, generator=generator)
        logits = logits.round(decimals=1) if trial % 2 else logits.bfloat16().float()
        if trial % 5 == 0:
            logits[:, : vocab_size // 3] = float("-inf")
        top_k = torch.randint(-1, vocab_size // 4 + 1, (num_reqs,), generator=generator)
        top_k[0] = vocab_size + 3 if trial % 3 == 0 else top_k[0]
        enabled = top_k[top_k < vocab_size].clamp(min=1)
        max_top_k = int(enabled.max()) if enabled.numel() else 1
        top_p = torch.ones(num_reqs)
        expected = apply_top_k_top_p_(logits.clone(), top_k, top_p, apply_top_p=False)
        actual = apply_top_k_top_p_(
            logits.clone(), top_k, top_p, apply_top_p=False, max_top_k=max_top_k
        )
        assert torch.equal(actual, expected), trial


def test_flags_max_top_k_counts_random_rows_that_set_top_k():
    from ladle.sample.metadata import SamplingFlags

    params = [
        SamplingParams(temperature=0.0, top_k=500),  # greedy: its top_k never applies
        SamplingParams(temperature=0.7, top_k=-1),
        SamplingParams(temperature=0.7, top_k=40),
        SamplingParams(temperature=0.9, top_k=7),
    ]
    assert SamplingFlags.from_params(params).max_top_k == 40
    assert SamplingFlags.from_params(params[:2]).max_top_k == 0
