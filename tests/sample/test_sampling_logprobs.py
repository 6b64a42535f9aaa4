"""Logprobs and ranks of the raw distribution, and their conversion into TokenLogprobs."""

import pytest
import torch

from ladle.protocol.messages import TokenLogprobs
from ladle.sample import Sampler, SamplerOutput, build_sampling_metadata, logprobs_to_messages
from ladle.sample.logprobs import gather_logprobs, pack_logprobs, unpack_logprobs
from ladle.sampling.params import SamplingParams

VOCAB = 300


def test_logprobs_and_ranks_match_log_softmax_of_raw_logits() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, VOCAB, generator=generator) * 2
    params = [
        SamplingParams(temperature=0.0, logprobs=5),
        SamplingParams(temperature=0.5, top_k=20, logprobs=2),
        SamplingParams(temperature=1.5, repetition_penalty=2.0, frequency_penalty=1.0),
        SamplingParams(temperature=1.0, logprobs=0),
        SamplingParams(temperature=2.0, top_p=0.99, logprobs=5),
        SamplingParams(temperature=1.0, min_tokens=3),
    ]
    metadata = build_sampling_metadata(
        params, list(range(6)), [1] * 6, vocab_size=VOCAB,
        prompt_token_ids=[[1, 2]] * 6, output_token_ids=[[3]] * 6, eos_token_ids=[[0]] * 6,
    )
    output = Sampler()(logits, metadata)
    assert output.logprobs is not None and output.logprob_token_ids is not None
    assert output.logprobs.shape == output.logprob_token_ids.shape == (6, 6)

    expected = torch.log_softmax(logits, dim=-1)
    sampled = output.sampled_token_ids
    assert torch.equal(output.logprob_token_ids[:, 0], sampled)
    torch.testing.assert_close(output.logprobs[:, 0], expected.gather(1, sampled[:, None])[:, 0])
    top_values, top_ids = expected.topk(5, dim=-1)
    assert torch.equal(output.logprob_token_ids[:, 1:], top_ids)
    torch.testing.assert_close(output.logprobs[:, 1:], top_values)
    for row in range(6):
        sampled_logprob = expected[row, sampled[row]]
        assert output.sampled_ranks[row].item() == int((expected[row] > sampled_logprob).sum()) + 1
    assert output.sampled_ranks[0].item() == 1  # greedy takes the top token


def test_no_logprobs_requested_computes_none() -> None:
    metadata = build_sampling_metadata([SamplingParams()], [0], [0], vocab_size=VOCAB)
    output = Sampler()(torch.randn(1, VOCAB), metadata)
    assert output.logprobs is None and output.logprob_token_ids is None
    assert output.sampled_ranks is None
    assert logprobs_to_messages(output, [None]) == [None]


def test_ties_share_the_best_rank() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    metadata = build_sampling_metadata([SamplingParams(temperature=0.0, logprobs=1)], [0], [0],
                                       vocab_size=4)
    output = Sampler()(logits, metadata)
    assert output.sampled_ranks.tolist() == [1]


def test_messages_trim_to_each_requests_own_k() -> None:
    output = SamplerOutput(
        sampled_token_ids=torch.tensor([4, 7, 2]),
        logprob_token_ids=torch.tensor([[4, 1, 4, 5], [7, 7, 3, 0], [2, 9, 8, 2]]),
        logprobs=torch.tensor([[-1.5, -0.5, -1.5, -2.0], [-0.1, -0.1, -3.0, -4.0],
                               [-2.5, -0.2, -1.0, -2.5]]),
        sampled_ranks=torch.tensor([2, 1, 3]),
    )
    messages = logprobs_to_messages(output, [3, None, 0])
    assert messages[1] is None
    assert messages[0] == TokenLogprobs(token_id=4, logprob=-1.5, rank=2, top_token_ids=[1, 4, 5],
                                        top_logprobs=[-0.5, -1.5, -2.0])
    assert messages[2] == TokenLogprobs(token_id=2, logprob=-2.5, rank=3)


def test_sampled_token_alone_equals_the_first_column_of_a_top_k_request() -> None:
    """logprobs=0 skips the top-k and the joins; its sampled logprob and rank are the same
    numbers, bit for bit, as a request for top candidates gets in column 0."""
    generator = torch.Generator().manual_seed(3)
    raw = torch.log_softmax(torch.randn(5, VOCAB, generator=generator) * 3, dim=-1)
    sampled = torch.tensor([0, 7, VOCAB - 1, 42, 7])
    alone_ids, alone_logprobs, alone_ranks = gather_logprobs(raw, sampled, 0)
    top_ids, top_logprobs, top_ranks = gather_logprobs(raw, sampled, 4)
    assert alone_ids.shape == alone_logprobs.shape == (5, 1)
    assert torch.equal(alone_ids, top_ids[:, :1]) and torch.equal(alone_ids[:, 0], sampled)
    assert torch.equal(alone_logprobs, top_logprobs[:, :1])
    assert torch.equal(alone_ranks, top_ranks)
    expected_ranks = [int((raw[row] > raw[row, sampled[row]]).sum()) + 1 for row in range(5)]
    assert alone_ranks.tolist() == expected_ranks


@pytest.mark.parametrize("num_logprobs", [0, 1, 5])
@pytest.mark.parametrize("num_rows", [1, 3])
def test_packed_logprobs_unpack_to_the_same_tensors(num_logprobs: int, num_rows: int) -> None:
    """The runner copies a step's logprob tensors to the host as one byte buffer."""
    generator = torch.Generator().manual_seed(num_rows * 10 + num_logprobs)
    raw = torch.log_softmax(torch.randn(num_rows, VOCAB, generator=generator), dim=-1)
    sampled = torch.randint(0, VOCAB, (num_rows,), generator=generator)
    token_ids, logprobs, ranks = gather_logprobs(raw, sampled, num_logprobs)
    output = SamplerOutput(sampled, token_ids, logprobs, ranks)
    packed = pack_logprobs(output)
    assert packed.dtype == torch.uint8 and packed.dim() == 1
    unpacked = unpack_logprobs(packed.clone(), sampled, num_logprobs + 1)
    assert torch.equal(unpacked.sampled_token_ids, sampled)
    assert torch.equal(unpacked.logprob_token_ids, token_ids)
    assert torch.equal(unpacked.logprobs, logprobs)
    assert torch.equal(unpacked.sampled_ranks, ranks)
    width = [num_logprobs] * num_rows
    assert logprobs_to_messages(unpacked, width) == logprobs_to_messages(output, width)
