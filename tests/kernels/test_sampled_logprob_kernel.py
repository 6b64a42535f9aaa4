"""kernels/sampled_logprob.py (the sampled token's logprob and rank, `logprobs: 0`) against
torch's log-softmax in float64 and the torch path's ranks, at awkward vocabulary sizes (1, 7,
one program's 8192 tokens, 8193, Qwen3's 151,936), 16- and 32-bit logits, ties and -inf; and
through the Sampler, whose greedy tokens and logprobs it must not change.

Runs under Triton's interpreter on the CPU (a child pytest with TRITON_INTERPRET=1, as
test_draft_step_kernels.py does); skipped where Triton is not installed. The compiled kernel is
checked on a GPU in tests/gpu/test_fused_kernels.py.
"""

from __future__ import annotations

import pytest
import torch
from helpers.interpreter import interpreted, parent_only, run_in_interpreter_child

pytest.importorskip("triton")


@pytest.mark.slow
@parent_only
def test_kernel_under_the_interpreter():
    run_in_interpreter_child(__file__, timeout=900)


def _reference(logits: torch.Tensor, sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs float64 [n], ranks [n]): log-softmax in float64; the rank as the torch path
    counts it (its float32 log-softmax, strictly greater)."""
    exact = torch.log_softmax(logits.double(), dim=-1).gather(1, sampled[:, None])[:, 0]
    raw = torch.log_softmax(logits.float(), dim=-1)
    chosen = raw.gather(1, sampled[:, None])
    return exact, (raw > chosen).sum(dim=-1) + 1


@interpreted
@pytest.mark.parametrize(
    ("num_rows", "vocab_size", "dtype"),
    [
        (1, 1, torch.float32),
        (2, 7, torch.float32),
        (3, 8192, torch.bfloat16),
        (2, 8193, torch.float16),
        (1, 151_936, torch.bfloat16),
        (3, 20_000, torch.float32),
    ],
)
def test_logprob_and_rank_match_the_log_softmax(num_rows, vocab_size, dtype):
    from ladle.kernels.sampled_logprob import sampled_logprob_and_rank

    generator = torch.Generator().manual_seed(vocab_size + num_rows)
    logits = (torch.randn(num_rows, vocab_size, generator=generator) * 4).to(dtype)
    sampled = torch.randint(0, vocab_size, (num_rows,), generator=generator)
    sampled[0] = logits[0].float().argmax()  # the top token: rank 1
    token_ids, logprobs, ranks = sampled_logprob_and_rank(logits, sampled)
    exact, expected_ranks = _reference(logits, sampled)
    assert torch.equal(token_ids, sampled[:, None])
    assert logprobs.dtype == torch.float32 and logprobs.shape == (num_rows, 1)
    # Within float32's rounding of a 151,936-term sum (torch's own float32 path on this CPU is
    # ~3e-5 off at that size).
    torch.testing.assert_close(logprobs[:, 0].double(), exact, rtol=1e-6, atol=2e-6)
    assert ranks.dtype == torch.int64 and torch.equal(ranks, expected_ranks)
    assert ranks[0].item() == 1


@interpreted
def test_ties_share_the_best_rank_and_minus_inf_never_counts():
    from ladle.kernels.sampled_logprob import sampled_logprob_and_rank

    inf = float("inf")
    logits = torch.tensor(
        [[1.0, 3.0, 3.0, 0.0, -inf], [-inf, 2.0, -inf, 2.0, 1.0], [5.0, 4.0, 4.0, 4.0, 3.0]]
    )
    sampled = torch.tensor([2, 4, 3])
    _, logprobs, ranks = sampled_logprob_and_rank(logits, sampled)
    assert ranks.tolist() == [1, 3, 2]
    exact = torch.log_softmax(logits.double(), dim=-1).gather(1, sampled[:, None])
    torch.testing.assert_close(logprobs.double(), exact, rtol=1e-6, atol=1e-6)


@interpreted
@pytest.mark.parametrize("penalised", [False, True])
def test_sampler_tokens_unchanged_and_logprobs_of_the_raw_logits(monkeypatch, penalised):
    """The Sampler with the fused kernels (greedy rows: the interpreter has no libdevice for the
    random draw) gives the torch path's tokens, and the raw distribution's logprobs even when
    penalties change the logits it samples from."""
    from ladle.sample import Sampler, build_sampling_metadata
    from ladle.sample import sampler as sampler_module
    from ladle.sampling.params import SamplingParams

    vocab_size = 9000
    generator = torch.Generator().manual_seed(5)
    logits = (torch.randn(3, vocab_size, generator=generator) * 3).to(torch.bfloat16)
    penalty = {"repetition_penalty": 1.5} if penalised else {}
    params = [SamplingParams(temperature=0.0, logprobs=0, **penalty) for _ in range(3)]
    metadata = build_sampling_metadata(
        params, [0, 1, 2], [1, 1, 1], vocab_size=vocab_size,
        prompt_token_ids=[[1, 2]] * 3, output_token_ids=[[3]] * 3,
    )
    torch_path = Sampler()(logits, metadata)
    monkeypatch.setattr(sampler_module, "use_fused_kernels", lambda tensor: True)
    untouched = logits.clone()
    fused = Sampler()(logits, metadata)
    assert torch.equal(logits, untouched)
    assert torch.equal(fused.sampled_token_ids, torch_path.sampled_token_ids)
    assert torch.equal(fused.logprob_token_ids, torch_path.logprob_token_ids)
    assert torch.equal(fused.sampled_ranks, torch_path.sampled_ranks)
    torch.testing.assert_close(fused.logprobs, torch_path.logprobs, rtol=1e-6, atol=2e-6)
