"""PenaltyHistory keeps the penalty rows' token ids on the device: what it gathers for a step must
equal the padded tensors the host builds from its own lists (build_penalty_token_ids), through
row reuse, growth and a repeated step, and the sampler must then give the same tokens."""

from __future__ import annotations

import random

import torch

from ladle.core.request import Request
from ladle.sample.metadata import build_penalty_token_ids, build_sampling_metadata
from ladle.sample.sampler import Sampler
from ladle.sampling.params import SamplingParams
from ladle.worker.penalty_history import MIN_OUTPUT_WIDTH, PenaltyHistory

VOCAB = 50


def _request(request_id: str, prompt_length: int, penalty: bool, rng: random.Random) -> Request:
    params = SamplingParams(
        temperature=0.0,
        max_tokens=12,
        repetition_penalty=1.5 if penalty else 1.0,
        frequency_penalty=0.7 if penalty else 0.0,
        presence_penalty=0.3 if penalty else 0.0,
    )
    prompt = [rng.randrange(VOCAB) for _ in range(prompt_length)]
    return Request(request_id=request_id, prompt_token_ids=prompt, sampling_params=params)


def _host_reference(requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
    """The host's tensors, with rows that use no penalty emptied (the sampler ignores them)."""
    prompts = [r.prompt_token_ids if r.sampling_params.uses_penalties else [] for r in requests]
    outputs = [r.output_token_ids if r.sampling_params.uses_penalties else [] for r in requests]
    return build_penalty_token_ids(prompts, outputs, VOCAB)


def _same_ids(device: torch.Tensor, host: torch.Tensor) -> bool:
    """Equal as multisets per row (padding = VOCAB), whatever the widths."""
    if device.shape[0] != host.shape[0]:
        return False
    for row_device, row_host in zip(device.tolist(), host.tolist()):
        if sorted(t for t in row_device if t != VOCAB) != sorted(t for t in row_host if t != VOCAB):
            return False
    return True


def test_history_matches_the_host_lists_through_reuse_growth_and_repeats():
    rng = random.Random(0)
    history = PenaltyHistory(VOCAB, torch.device("cpu"))
    live = [_request(f"r{i}", rng.randint(1, 9), penalty=i % 3 != 1, rng=rng) for i in range(5)]
    next_id = 5
    for step in range(150):  # past MIN_OUTPUT_WIDTH: the output width grows
        num_output = [r.num_output_tokens for r in live]
        rows = history.rows_for(live, num_output)
        assert rows is not None
        prompt, output = history.token_ids(rows)
        host_prompt, host_output = _host_reference(live)
        assert _same_ids(prompt, host_prompt) and _same_ids(output, host_output)
        sampled = torch.tensor([rng.randrange(VOCAB) for _ in live])
        history.record(rows, sampled)
        if step % 4 == 1:
            # A repeated step (a fault-isolation probe, then the re-run) writes the same place
            # and must not read its own token as a past one.
            again = history.rows_for(live, num_output)
            assert _same_ids(history.token_ids(again)[1], host_output)
            history.record(again, sampled)
        for request, token in zip(live, sampled.tolist()):
            request.append_output_token(token)
        if step % 40 == 39:  # one ends, a longer prompt takes its row (widths grow)
            ended = live.pop(rng.randrange(len(live)))
            history.release([ended.request_id])
            live.append(_request(f"r{next_id}", rng.randint(5, 40), penalty=True, rng=rng))
            next_id += 1
    assert history.output_ids.shape[1] > MIN_OUTPUT_WIDTH  # the growth above was exercised


def test_sampler_gives_the_same_tokens_from_the_history():
    rng = random.Random(1)
    requests = [_request(f"r{i}", 6, penalty=i != 2, rng=rng) for i in range(4)]
    for request in requests:
        for _ in range(rng.randint(0, 5)):
            request.append_output_token(rng.randrange(VOCAB))
    # Logits that favour the tokens already seen, so the penalties decide the argmax.
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0))  # order-proof
    for row, request in enumerate(requests):
        logits[row, request.all_token_ids] += 3.0
    params = [r.sampling_params for r in requests]
    counts = [r.num_output_tokens for r in requests]
    common = dict(vocab_size=VOCAB, output_token_ids=[r.output_token_ids for r in requests])
    host = build_sampling_metadata(
        params, [0] * 4, counts, prompt_token_ids=[r.prompt_token_ids for r in requests], **common
    )
    history = PenaltyHistory(VOCAB, torch.device("cpu"))
    rows = history.rows_for(requests, counts)
    assert rows is not None
    on_device = build_sampling_metadata(
        params, [0] * 4, counts, penalty_token_ids=history.token_ids(rows), **common
    )
    expected = Sampler()(logits, host).sampled_token_ids
    assert torch.equal(Sampler()(logits, on_device).sampled_token_ids, expected)
    plain = Sampler()(
        logits,
        build_sampling_metadata(
            [SamplingParams(temperature=0)] * 4, [0] * 4, counts, vocab_size=VOCAB
        ),
    )
    assert not torch.equal(plain.sampled_token_ids, expected)  # the penalties mattered


def test_no_penalty_rows_take_no_history():
    rng = random.Random(2)
    history = PenaltyHistory(VOCAB, torch.device("cpu"))
    requests = [_request("a", 3, penalty=False, rng=rng)]
    assert history.rows_for(requests, [0]) is None
    assert history.num_rows == 0
