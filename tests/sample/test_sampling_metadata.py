"""Sampling rows, flags and padded token ids, as the model runner builds and ships them."""

import pytest
import torch

from ladle.sample import (
    ROW_DTYPES,
    SamplingFlags,
    SamplingMetadata,
    build_penalty_token_ids,
    build_sampling_metadata,
    build_sampling_rows,
    pad_token_ids,
)
from ladle.sampling.params import SamplingParams


def test_rows_are_4_byte_host_tensors_with_mapped_values() -> None:
    params = [
        SamplingParams(temperature=0.0, top_k=-1, repetition_penalty=1.2),
        SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05,
                       presence_penalty=0.5, frequency_penalty=-0.5),
    ]
    rows = build_sampling_rows(params, [2**40 + 5, -1], [0, 12])
    assert list(rows) == list(ROW_DTYPES)
    for name, tensor in rows.items():
        assert tensor.dtype in (torch.float32, torch.int32), name
        assert tensor.dtype == ROW_DTYPES[name] and tensor.shape == (2,)
        assert tensor.device.type == "cpu"
    assert rows["top_k"].tolist() == [0, 40]
    assert rows["seed"].tolist() == [5, 2**31 - 1]  # low 31 bits, never negative
    assert rows["step"].tolist() == [0, 12]
    torch.testing.assert_close(rows["temperature"], torch.tensor([0.0, 0.7]))
    torch.testing.assert_close(rows["repetition_penalty"], torch.tensor([1.2, 1.0]))


def test_rows_pack_into_one_buffer_and_view_back() -> None:
    rows = build_sampling_rows([SamplingParams(temperature=0.3, top_k=7)] * 3, [1, 2, 3], [4, 5, 6])
    packed = torch.stack([t.view(torch.int32) for t in rows.values()])  # one copy in the runner
    views = {name: packed[i].view(dtype) for i, (name, dtype) in enumerate(ROW_DTYPES.items())}
    for name in ROW_DTYPES:
        assert torch.equal(views[name], rows[name])
    metadata = SamplingMetadata.from_rows(views, SamplingFlags.from_params([SamplingParams()] * 3))
    assert metadata.num_reqs == 3


def test_rows_reject_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        build_sampling_rows([SamplingParams()], [1, 2], [0])


def test_flags() -> None:
    greedy = SamplingParams(temperature=0.0, top_k=5, top_p=0.5, min_p=0.2)
    plain = SamplingParams()
    flags = SamplingFlags.from_params([greedy, plain])
    # Truncation on greedy rows changes nothing, so it sets no flag.
    assert flags == SamplingFlags(all_greedy=False, all_random=False, no_top_k=True, no_top_p=True,
                                  no_min_p=True, no_penalties=True, max_num_logprobs=None,
                                  no_min_tokens=True, no_logit_edits=True)
    flags = SamplingFlags.from_params([greedy, SamplingParams(temperature=0.0, logprobs=3,
                                                              presence_penalty=0.1)])
    assert flags.all_greedy and not flags.all_random and not flags.no_penalties
    assert flags.max_num_logprobs == 3
    flags = SamplingFlags.from_params([SamplingParams(top_k=3, logprobs=0),
                                       SamplingParams(top_p=0.5, min_p=0.1, logprobs=2)])
    assert flags.all_random and not flags.all_greedy
    assert not flags.no_top_k and not flags.no_top_p and not flags.no_min_p
    assert flags.max_num_logprobs == 2
    # What makes a batch build its stop-id bans and its logit edits each step.
    assert not SamplingFlags.from_params([plain, SamplingParams(min_tokens=2)]).no_min_tokens
    for edits in ({"logit_bias": {1: 2.0}}, {"allowed_token_ids": [1]},
                  {"bad_words_token_ids": [[1, 2]]}):
        assert not SamplingFlags.from_params([plain, SamplingParams(**edits)]).no_logit_edits


def test_flags_skip_only_what_no_row_needs() -> None:
    """With the flags that skip them, bans and edits still come when some row needs them."""
    params = [SamplingParams(), SamplingParams(min_tokens=3, logit_bias={2: 1.5})]
    metadata = build_sampling_metadata(params, [0, 0], [0, 0], vocab_size=8,
                                       eos_token_ids=[[3], [3]], output_token_ids=[[], []])
    assert metadata.banned_token_ids.tolist() == [[8], [3]]
    assert metadata.logit_edits.bias_token_ids.tolist() == [2]
    plain = build_sampling_metadata(params[:1], [0], [0], vocab_size=8, eos_token_ids=[[3]])
    assert plain.banned_token_ids is None and plain.logit_edits is None


def test_penalties_need_token_ids() -> None:
    params = [SamplingParams(repetition_penalty=1.1)]
    with pytest.raises(ValueError, match="penalties need"):
        build_sampling_metadata(params, [0], [0], vocab_size=8)
    rows = build_sampling_rows(params, [0], [0])
    with pytest.raises(ValueError, match="penalties need"):
        SamplingMetadata.from_rows(rows, SamplingFlags.from_params(params))
    with pytest.raises(ValueError, match="missing"):
        SamplingMetadata.from_rows({"temperature": rows["temperature"]},
                                   SamplingFlags.from_params(params))


def test_padding() -> None:
    padded = pad_token_ids([[1, 2, 3], [], [4]], pad_id=9)
    assert padded.tolist() == [[1, 2, 3], [9, 9, 9], [4, 9, 9]]
    assert pad_token_ids([[], []], pad_id=9).tolist() == [[9], [9]]  # never zero-width
    prompt, output = build_penalty_token_ids([[1], [2, 3]], [[], [4]], vocab_size=50)
    assert prompt.dtype == output.dtype == torch.int64
    assert prompt.tolist() == [[1, 50], [2, 3]] and output.tolist() == [[50], [4]]


def test_token_ids_are_only_built_when_needed() -> None:
    metadata = build_sampling_metadata([SamplingParams()], [0], [0], vocab_size=8,
                                       prompt_token_ids=[[1]], output_token_ids=[[2]],
                                       eos_token_ids=[[3]])
    assert metadata.prompt_token_ids is None and metadata.output_token_ids is None
    assert metadata.banned_token_ids is None
