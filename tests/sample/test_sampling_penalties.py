"""Penalties against a hand-written reference, and min_tokens bans on stop and eos ids."""

import torch

from ladle.sample import Sampler, build_banned_token_ids, build_sampling_metadata
from ladle.sample.penalties import apply_penalties_, token_counts
from ladle.sampling.params import SamplingParams

VOCAB = 10


def reference_penalties(logits: list[float], prompt: list[int], output: list[int],
                        presence: float, frequency: float, repetition: float) -> list[float]:
    """vLLM / OpenAI semantics, one token at a time."""
    result = []
    for token, logit in enumerate(logits):
        if token in prompt or token in output:
            logit = logit / repetition if logit > 0 else logit * repetition
        count = output.count(token)
        logit -= frequency * count
        if count > 0:
            logit -= presence
        result.append(logit)
    return result


CASES = [
    # prompt, output, presence, frequency, repetition
    ([1, 2, 2], [3, 3, 3, 4], 0.5, 0.3, 1.5),
    ([], [0, 9, 9], -1.0, 0.0, 1.0),
    ([5, 6], [], 0.0, 2.0, 0.7),
    ([7], [7, 8], 0.0, -0.4, 2.0),
    ([], [], 1.0, 1.0, 3.0),
]


def test_penalties_match_reference() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(len(CASES), VOCAB, generator=generator) * 2
    params = [SamplingParams(presence_penalty=c[2], frequency_penalty=c[3], repetition_penalty=c[4])
              for c in CASES]
    metadata = build_sampling_metadata(
        params, [0] * len(CASES), [len(c[1]) for c in CASES], vocab_size=VOCAB,
        prompt_token_ids=[c[0] for c in CASES], output_token_ids=[c[1] for c in CASES],
    )
    penalised = apply_penalties_(
        logits.clone(), metadata.prompt_token_ids, metadata.output_token_ids,
        metadata.presence_penalty, metadata.frequency_penalty, metadata.repetition_penalty,
    )
    for row, (prompt, output, presence, frequency, repetition) in enumerate(CASES):
        expected = reference_penalties(logits[row].tolist(), prompt, output,
                                       presence, frequency, repetition)
        torch.testing.assert_close(penalised[row], torch.tensor(expected), rtol=1e-6, atol=1e-6)


def test_neutral_penalty_rows_are_bit_identical() -> None:
    logits = torch.randn(2, VOCAB)
    prompt = torch.tensor([[1, 2, VOCAB], [3, VOCAB, VOCAB]])
    output = torch.tensor([[4, 4], [5, VOCAB]])
    penalised = apply_penalties_(
        logits.clone(), prompt, output,
        torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]),
    )
    assert torch.equal(penalised[0], logits[0])


def test_counts_ignore_padding() -> None:
    counts = token_counts(torch.tensor([[2, 2, 5, VOCAB, VOCAB]]), VOCAB)
    assert counts.shape == (1, VOCAB)
    assert counts[0].tolist() == [0, 0, 2, 0, 0, 1, 0, 0, 0, 0]


def test_greedy_follows_penalised_logits() -> None:
    # Token 3 leads, but it was already generated: the repetition penalty hands the win to 4.
    logits = torch.tensor([[0.0, 0.0, 0.0, 2.0, 1.5, 0, 0, 0, 0, 0]])
    params = [SamplingParams(temperature=0.0, repetition_penalty=2.0)]
    metadata = build_sampling_metadata(params, [0], [1], vocab_size=VOCAB,
                                       prompt_token_ids=[[0]], output_token_ids=[[3]])
    assert Sampler()(logits, metadata).sampled_token_ids.tolist() == [4]


def test_min_tokens_bans_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros(4, VOCAB)
    logits[:, 9] = 10.0  # eos
    logits[:, 8] = 9.0  # a stop token id
    logits[:, 1] = 1.0
    params = [
        SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[8]),
        SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[8]),
        SamplingParams(temperature=0.0, min_tokens=3, ignore_eos=True),  # eos is no stop here
        SamplingParams(temperature=1.0, min_tokens=5, stop_token_ids=[8]),
    ]
    num_output_tokens = [2, 3, 0, 0]
    eos = [[9]] * 4
    banned = build_banned_token_ids(params, num_output_tokens, eos, VOCAB)
    assert banned is not None
    assert banned.tolist() == [[8, 9], [VOCAB, VOCAB], [VOCAB, VOCAB], [8, 9]]
    metadata = build_sampling_metadata(params, [0] * 4, num_output_tokens, vocab_size=VOCAB,
                                       eos_token_ids=eos)
    sampled = Sampler()(logits, metadata).sampled_token_ids.tolist()
    assert sampled[0] == 1  # both stops banned
    assert sampled[1] == 9  # min_tokens reached
    assert sampled[2] == 9  # ignore_eos: nothing banned
    assert sampled[3] not in (8, 9)


def test_no_bans_needed_builds_nothing() -> None:
    params = [SamplingParams(min_tokens=2), SamplingParams()]
    assert build_banned_token_ids(params, [2, 0], [[9], [9]], VOCAB) is None
    # Ids outside the logits' width are dropped rather than scattered out of range.
    assert build_banned_token_ids([SamplingParams(min_tokens=1)], [0], [[VOCAB + 3]], VOCAB) is None
