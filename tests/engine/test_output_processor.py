"""The output processor folds engine outputs into RequestOutputs; one request's failure to turn
into text ends that request alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ladle.frontend.output_processor import OutputProcessor
from ladle.protocol.messages import EngineCoreOutput
from ladle.sampling.params import SamplingParams

POISON_ID = 13


class PoisonedTokenizer:
    """Decodes through a real tokenizer but fails on one id, as a broken tokenizer might."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return len(self.tokenizer)

    def decode(self, token_ids, **kwargs) -> str:
        if POISON_ID in token_ids:
            raise RuntimeError("cannot decode")
        return self.tokenizer.decode(token_ids, **kwargs)


@dataclass
class FakeTextTokenizer:
    hf_tokenizer: Any
    eos_token_ids: tuple[int, ...] = (3,)


def test_a_failing_request_ends_alone(tiny_tokenizer):
    processor = OutputProcessor(FakeTextTokenizer(PoisonedTokenizer(tiny_tokenizer)))
    params = SamplingParams(max_tokens=5)
    processor.add_request("good", None, [5, 6], params, arrival_time=0.0)
    processor.add_request("bad", None, [5, 6], params, arrival_time=0.0)
    outputs, to_abort = processor.process_outputs(
        [EngineCoreOutput("good", [40]), EngineCoreOutput("bad", [POISON_ID])]
    )
    by_id = {o.request_id: o for o in outputs}
    assert to_abort == ["bad"]
    assert by_id["bad"].finished and by_id["bad"].outputs[0].finish_reason == "error"
    assert "cannot decode" in by_id["bad"].error
    assert not by_id["good"].finished
    outputs, to_abort = processor.process_outputs(
        [EngineCoreOutput("good", [41], finish_reason="length"), EngineCoreOutput("bad", [42])]
    )
    assert [o.request_id for o in outputs] == ["good"] and to_abort == []
    assert outputs[0].outputs[0].text == tiny_tokenizer.decode([40, 41])
    assert not processor.has_unfinished_requests()


def test_n_samples_fold_into_one_output(tiny_tokenizer):
    processor = OutputProcessor(FakeTextTokenizer(tiny_tokenizer))
    core_requests = processor.add_request(
        "r", "p", [5], SamplingParams(n=2, seed=9, max_tokens=2), arrival_time=0.0
    )
    assert [r.request_id for r in core_requests] == ["r#0", "r#1"]
    assert core_requests[0].sampling_params.seed == 9
    assert core_requests[1].sampling_params.seed not in (None, 9)
    processor.process_outputs([EngineCoreOutput("r#0", [40], finish_reason="length")])
    outputs, _ = processor.process_outputs([EngineCoreOutput("r#1", [41], finish_reason="length")])
    assert outputs[0].finished
    assert [c.token_ids for c in outputs[0].outputs] == [[40], [41]]


def test_deferred_text_equals_streamed_text(tiny_tokenizer):
    """Offline generation decodes a sample once at the end; the text must be the same."""
    text = "Héllo wörld, 你好 — streaming 🙂 text"
    token_ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    results = []
    for stream_text in (True, False):
        processor = OutputProcessor(FakeTextTokenizer(tiny_tokenizer), stream_text=stream_text)
        processor.add_request("r", None, [5, 6], SamplingParams(max_tokens=100), arrival_time=0.0)
        for index, token_id in enumerate(token_ids):
            finish = "length" if index == len(token_ids) - 1 else None
            outputs, _ = processor.process_outputs(
                [EngineCoreOutput("r", [token_id], finish_reason=finish)]
            )
        results.append(outputs[0].outputs[0])
    streamed, deferred = results
    assert deferred.text == streamed.text == tiny_tokenizer.decode(token_ids)
    assert deferred.token_ids == streamed.token_ids == token_ids


def test_a_streamed_request_keeps_only_each_steps_logprobs():
    """A stream reads logprobs_delta; the whole list would be 3 objects a token held for the
    request's life (every full garbage-collector scan walks them). A non-streamed request keeps
    them all for its final response."""
    from ladle.protocol.messages import TokenLogprobs

    processor = OutputProcessor(None)
    params = SamplingParams(max_tokens=3, logprobs=1)
    processor.add_request("streamed", None, [1, 2], params, 0.0, deltas_only=True)
    processor.add_request("whole", None, [1, 2], params, 0.0)
    for step, token in enumerate((5, 6, 7)):
        finished = "length" if step == 2 else None
        outputs, _ = processor.process_outputs([
            EngineCoreOutput(request_id=request_id, new_token_ids=[token],
                             new_logprobs=[TokenLogprobs(token, -0.5, 1)], finish_reason=finished)
            for request_id in ("streamed", "whole")
        ])
        by_id = {output.request_id: output.outputs[0] for output in outputs}
        for completion in by_id.values():
            assert [entry.token_id for entry in completion.logprobs_delta] == [token]
    assert by_id["streamed"].logprobs == []
    assert [entry.token_id for entry in by_id["whole"].logprobs] == [5, 6, 7]
    assert by_id["streamed"].token_ids == by_id["whole"].token_ids == [5, 6, 7]
