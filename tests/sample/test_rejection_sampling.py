"""The rejection sampler against a plain-torch, one-row-at-a-time reference, and the emitted
tokens' distribution against the target's (chi-square)."""

from __future__ import annotations

import pytest
import torch

from ladle.sample import Sampler, build_sampling_metadata
from ladle.sample.rejection import NO_DRAFT, emitted_tokens, rejection_sample
from ladle.sample.rng import counter_gumbels, counter_row_uniforms
from ladle.sampling.params import SamplingParams


def _reference_emitted(logits, drafts, draft_probs, uniforms, gumbels):
    """Textbook speculative sampling for one request, row by row in Python: accept draft j with
    probability min(1, p_j(t) / q_j(t)) (the coin: uniforms[j]); on rejection draw from
    normalise(max(p_j - q_j, 0)); after every draft accepted, draw from p_k. Draws use the
    Gumbel-max trick with the given noise, so the result is comparable token for token."""
    emitted = []
    for j, draft in enumerate(drafts):
        p = torch.softmax(logits[j].double(), dim=-1)
        q = draft_probs[j].double()
        if uniforms[j].item() * q[draft].item() < p[draft].item():
            emitted.append(draft)
            continue
        residual = (p - q).clamp(min=0)
        if residual.sum() <= 0:
            residual = p
        emitted.append(int((residual.log() + gumbels[j].double()).argmax()))
        return emitted
    p = torch.softmax(logits[len(drafts)].double(), dim=-1)
    emitted.append(int((p.log() + gumbels[len(drafts)].double()).argmax()))
    return emitted


def _rows(drafts_per_request):
    return [(i, j) for i, drafts in enumerate(drafts_per_request) for j in range(len(drafts) + 1)]


def _row_drafts(drafts_per_request):
    ids = []
    for drafts in drafts_per_request:
        ids += list(drafts) + [NO_DRAFT]
    return torch.tensor(ids, dtype=torch.int64)


@pytest.mark.parametrize("vocab_size", [2, 7, 33, 1001])
@pytest.mark.parametrize("num_drafts", [1, 2, 5, 8])
def test_draft_probs_match_the_textbook_reference(vocab_size, num_drafts):
    generator = torch.Generator().manual_seed(vocab_size * 100 + num_drafts)
    num_requests = 6
    drafts_per_request = [
        torch.randint(0, vocab_size, (num_drafts,), generator=generator).tolist()
        for _ in range(num_requests)
    ]
    num_rows = num_requests * (num_drafts + 1)
    # Peaked logits so that some drafts are accepted and some rejected.
    logits = torch.randn(num_rows, vocab_size, generator=generator) * 3
    draft_probs = torch.softmax(torch.randn(num_rows, vocab_size, generator=generator) * 3, -1)
    seeds = torch.randint(0, 2**31 - 1, (num_rows,), generator=generator)
    steps = torch.arange(num_rows) % (num_drafts + 1) + 40
    row_drafts = _row_drafts(drafts_per_request)
    row_tokens = rejection_sample(logits, row_drafts, seeds, steps, draft_probs)
    emitted = emitted_tokens(row_tokens.tolist(), _rows(drafts_per_request), drafts_per_request)
    uniforms = counter_row_uniforms(seeds, steps)
    gumbels = counter_gumbels(seeds, steps, vocab_size)
    width = num_drafts + 1
    for i, drafts in enumerate(drafts_per_request):
        rows = slice(i * width, (i + 1) * width)
        expected = _reference_emitted(
            logits[rows], drafts, draft_probs[rows], uniforms[rows], gumbels[rows]
        )
        assert emitted[i] == expected


@pytest.mark.parametrize("num_drafts", [1, 3, 8])
def test_point_mass_drafts_accept_iff_the_race_picks_them(num_drafts):
    """draft_probs=None: the row token is the row's own Gumbel race; the walk keeps drafts while
    the race picked them, so emitted tokens equal what one-token steps at those output indices
    would emit (the seed-for-seed identity speculation keeps)."""
    vocab_size = 37
    generator = torch.Generator().manual_seed(num_drafts)
    logits = torch.randn(num_drafts + 1, vocab_size, generator=generator)
    seeds = torch.full((num_drafts + 1,), 1234)
    steps = torch.arange(num_drafts + 1) + 7
    race = (logits + counter_gumbels(seeds, steps, vocab_size)).argmax(-1).tolist()
    # Drafts that agree with the race up to a point, then disagree.
    agree = num_drafts // 2
    drafts = race[:agree] + [(race[agree] + 1) % vocab_size] + race[agree + 1 : num_drafts]
    row_tokens = rejection_sample(logits, _row_drafts([drafts]), seeds, steps)
    assert emitted_tokens(row_tokens.tolist(), _rows([drafts]), [drafts]) == [race[: agree + 1]]


def test_all_accepted_and_all_rejected():
    vocab_size = 50
    num_drafts = 4
    rows = num_drafts + 1
    seeds = torch.arange(rows)
    steps = torch.zeros(rows, dtype=torch.int64)
    drafts = [3, 9, 27, 41]
    # Every draft is the only token left (top-k 1 style): always accepted, bonus from p_k.
    logits = torch.full((rows, vocab_size), float("-inf"))
    for j, token in enumerate(drafts):
        logits[j, token] = 0.0
    logits[num_drafts, 5] = 0.0
    for draft_probs in (None, torch.softmax(torch.randn(rows, vocab_size), -1)):
        tokens = rejection_sample(logits, _row_drafts([drafts]), seeds, steps, draft_probs)
        assert emitted_tokens(tokens.tolist(), _rows([drafts]), [drafts]) == [drafts + [5]]
    # Every draft truncated away (p(t) = 0): rejected at once, the token drawn from the rest.
    logits = torch.randn(rows, vocab_size)
    logits[torch.arange(num_drafts), torch.tensor(drafts)] = float("-inf")
    for draft_probs in (None, torch.softmax(torch.randn(rows, vocab_size), -1)):
        tokens = rejection_sample(logits, _row_drafts([drafts]), seeds, steps, draft_probs)
        emitted = emitted_tokens(tokens.tolist(), _rows([drafts]), [drafts])[0]
        assert len(emitted) == 1 and emitted[0] != drafts[0]
        assert torch.isfinite(logits[0, emitted[0]])


def _chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of counts against probs (bins with expected count < 5 pooled)."""
    total = counts.sum().item()
    expected = probs.double() * total
    small = expected < 5
    observed = torch.cat([counts[~small].double(), counts[small].double().sum().reshape(1)])
    expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    statistic = (((observed - expected) ** 2) / expected).sum()
    dof = observed.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), statistic / 2.0))


def _target_probs(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    probs = torch.softmax(logits.double(), -1)
    order = probs.argsort(descending=True)
    mass_before = probs[order].cumsum(0) - probs[order]
    kept = torch.zeros_like(probs, dtype=torch.bool)
    kept[order[mass_before < top_p]] = True
    probs = torch.where(kept, probs, 0.0)
    return probs / probs.sum()


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_emitted_distribution_equals_the_target(with_draft_probs):
    """Temperature 1 and top-p 0.9 through the real Sampler, two drafts per request, 20k
    requests with different seeds: the first emitted token follows p_0, and the second, given
    the first draft was accepted, follows p_1 (each logits row is fixed, so p_1 does not depend
    on the first token). Point-mass drafts are fixed tokens; drafts with a distribution q are
    drawn from q, as a draft model's are. Both at p > 0.01, and a wrong target (no top-p) is
    rejected by the same counts."""
    torch.manual_seed(0)
    vocab_size = 24
    num_requests = 20_000
    base = torch.randn(3, vocab_size) * 1.5
    params = SamplingParams(temperature=1.0, top_p=0.9)
    logits = base.repeat(num_requests, 1)
    seeds = [request * 7919 + 13 for request in range(num_requests)]
    row_seeds = [seed for seed in seeds for _ in range(3)]
    steps = [step for _ in range(num_requests) for step in (0, 1, 2)]
    metadata = build_sampling_metadata([params] * len(row_seeds), row_seeds, steps,
                                       vocab_size=vocab_size)
    if with_draft_probs:
        q = torch.softmax(torch.randn(2, vocab_size), -1)
        drafts = torch.stack([torch.multinomial(q[j], num_requests, True) for j in (0, 1)], 1)
        drafts = drafts.tolist()
        metadata.draft_probs = torch.cat([q, q[:1]]).repeat(num_requests, 1)
        metadata.draft_token_ids = _row_drafts(drafts)
    else:
        drafts = [[int(base[0].argsort(descending=True)[1]), int(base[1].argmax())]]
        drafts = drafts * num_requests
    row_tokens = Sampler()(logits, metadata).sampled_token_ids.tolist()
    emitted = emitted_tokens(row_tokens, _rows(drafts), drafts)
    first = torch.bincount(torch.tensor([e[0] for e in emitted]), minlength=vocab_size)
    seconds = [e[1] for e, d in zip(emitted, drafts) if len(e) > 1]
    second = torch.bincount(torch.tensor(seconds), minlength=vocab_size)
    p0, p1 = _target_probs(base[0], 0.9), _target_probs(base[1], 0.9)
    assert len(seconds) > 1000  # the first draft was accepted often enough to test the second
    assert _chi_square_p_value(first, p0) > 0.01
    assert _chi_square_p_value(second, p1) > 0.01
    # Teeth: the same counts are far from the target without top-p.
    assert _chi_square_p_value(first, _target_probs(base[0], 1.0)) < 1e-6
