"""The front end's half of a request: token ids from the engine core in, RequestOutputs out.

It lives where the tokenizer lives (the offline LLM's process, or the server's API process), so
detokenization and stop strings never cost the engine loop time. It fans n > 1 out into n child
requests, each with a seed of its own, and folds their outputs back into one RequestOutput.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import msgspec

from ladle.frontend.detokenizer import IncrementalDetokenizer
from ladle.frontend.stop_checker import StopChecker
from ladle.frontend.tokenizer_required import ABSENT_REASON, needs_tokenizer
from ladle.model.tokenizer import TextTokenizer
from ladle.outputs import CompletionOutput, RequestMetrics, RequestOutput
from ladle.protocol.messages import EngineCoreOutput, EngineCoreRequest
from ladle.sample.bad_words import bad_words_token_ids
from ladle.sampling.params import SamplingParams

CHILD_SEPARATOR = "#"


def child_seed(seed: int | None, index: int) -> int | None:
    """Sample 0 keeps the request's seed (so n=1 and n>1 agree on it); the others get distinct
    seeds derived from it."""
    if seed is None or index == 0:
        return seed
    return (seed * 1_000_003 + index * 7_919) & 0x7FFFFFFF


@dataclass
class _SampleState:
    completion: CompletionOutput
    detokenizer: IncrementalDetokenizer | None
    stop_checker: StopChecker
    num_streamed_chars: int = 0


@dataclass
class _RequestState:
    output: RequestOutput
    params: SamplingParams
    samples: list[_SampleState]
    num_finished: int = 0
    touched: bool = False
    child_ids: list[str] = field(default_factory=list)
    # A streamed request is read through the *_delta fields alone: its cumulative logprobs
    # are not kept (3 objects a token, which would sit in every full garbage-collector scan).
    deltas_only: bool = False


class OutputProcessor:
    def __init__(
        self,
        tokenizer: TextTokenizer | None,
        eos_token_ids: tuple[int, ...] = (),
        stream_text: bool = True,
        no_tokenizer_reason: str = ABSENT_REASON,
    ) -> None:
        """stream_text=False (offline generation): a sample without stop strings is detokenized
        once when it finishes instead of at every step; its text is the same, and the host work
        between GPU steps shrinks. no_tokenizer_reason: why tokenizer is None, for the errors
        of requests that need one (tokenizer_required.py)."""
        self.stream_text = stream_text
        self.tokenizer = tokenizer
        self.no_tokenizer_reason = no_tokenizer_reason
        self.eos_token_ids = tuple(eos_token_ids) or (tokenizer.eos_token_ids if tokenizer else ())
        self._requests: dict[str, _RequestState] = {}
        self._child_to_parent: dict[str, tuple[str, int]] = {}

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
        priority: int = 0,
        deltas_only: bool = False,
    ) -> list[EngineCoreRequest]:
        """Register a request; returns the n engine-core requests to submit for it.
        deltas_only: the caller reads each step's *_delta fields and never the whole logprobs
        (a stream), so completion.logprobs stays empty."""
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if self.tokenizer is None:
            self._check_needs_no_tokenizer(params)
        if params.bad_words and params.bad_words_token_ids is None:
            params = dataclasses.replace(
                params, bad_words_token_ids=bad_words_token_ids(params.bad_words, self.tokenizer)
            )
        samples = []
        core_requests = []
        stop_checker = StopChecker.from_sampling_params(params)  # its tables are built once
        for index in range(params.n):
            child_id = request_id if params.n == 1 else f"{request_id}{CHILD_SEPARATOR}{index}"
            child_params = (
                params if params.n == 1 else params.with_seed(child_seed(params.seed, index))
            )
            detokenizer = None
            # detokenize=False: token ids only, and no decoding work at all (vLLM's option).
            if self.tokenizer is not None and params.detokenize:
                detokenizer = IncrementalDetokenizer(
                    self.tokenizer.hf_tokenizer, prompt_token_ids, params.skip_special_tokens
                )
            samples.append(
                _SampleState(
                    completion=CompletionOutput(
                        index=index, logprobs=[] if params.logprobs is not None else None
                    ),
                    detokenizer=detokenizer,
                    stop_checker=stop_checker if index == 0 else stop_checker.fresh_copy(),
                )
            )
            core_requests.append(
                EngineCoreRequest(
                    request_id=child_id,
                    prompt_token_ids=prompt_token_ids,
                    sampling_params=child_params,
                    eos_token_ids=self.eos_token_ids,
                    arrival_time=arrival_time,
                    priority=priority,
                )
            )
            self._child_to_parent[child_id] = (request_id, index)
        output = RequestOutput(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=prompt_token_ids,
            outputs=[s.completion for s in samples],
            metrics=RequestMetrics(arrival_time=arrival_time),
        )
        self._requests[request_id] = _RequestState(
            output=output,
            params=params,
            samples=samples,
            child_ids=[r.request_id for r in core_requests],
            deltas_only=deltas_only,
        )
        return core_requests

    def _check_needs_no_tokenizer(self, params: SamplingParams) -> None:
        """Refuse, naming the field, what only a tokenizer can do (rather than ignore it)."""
        needing = [
            ("stop (stop strings)", bool(params.stop)),
            ("bad_words", bool(params.bad_words) and params.bad_words_token_ids is None),
            ("structured_outputs (and response_format)", params.structured_outputs is not None),
        ]
        for feature, asked in needing:
            if asked:
                raise ValueError(needs_tokenizer(feature, self.no_tokenizer_reason))

    def process_outputs(
        self, core_outputs: list[EngineCoreOutput]
    ) -> tuple[list[RequestOutput], list[str]]:
        """Apply one step's outputs. Returns the RequestOutputs that changed (their *_delta
        fields hold this step's additions) and the child ids the engine core must abort
        because a stop string ended them."""
        touched: list[_RequestState] = []
        to_abort: list[str] = []
        now = time.monotonic()
        for core_output in core_outputs:
            parent = self._child_to_parent.get(core_output.request_id)
            if parent is None:
                continue  # already finished here (e.g. a stop string) or aborted
            state = self._requests[parent[0]]
            sample = state.samples[parent[1]]
            if not state.touched:
                state.touched = True
                for other in state.samples:
                    other.completion.text_delta = ""
                    other.completion.token_ids_delta = []
                    other.completion.logprobs_delta = (
                        [] if state.params.logprobs is not None else None
                    )
                touched.append(state)
            try:
                ended_here = self._apply(state, sample, core_output, now)
            except Exception as error:  # noqa: BLE001 - one request's failure is its own
                # Text processing failed for this sample alone (a tokenizer that cannot decode
                # what the model produced): end it with an error, keep every other request.
                sample.completion.finish_reason = "error"
                state.output.error = f"output processing failed: {type(error).__name__}: {error}"
                ended_here = True
            if core_output.error is not None:
                state.output.error = core_output.error  # the engine ended it (fault isolation)
            if ended_here and core_output.finish_reason is None:
                to_abort.append(core_output.request_id)
            if sample.completion.finished():
                self._finish_sample(state, core_output.request_id, now)
        for state in touched:
            state.touched = False
        return [state.output for state in touched], to_abort

    def _apply(
        self, state: _RequestState, sample: _SampleState, core_output: EngineCoreOutput, now: float
    ) -> bool:
        """Add one core output to one sample; True if a stop string ended it."""
        tokens = core_output.new_token_ids
        if len(tokens) > 1 and sample.detokenizer is not None and sample.stop_checker.stop:
            # Several tokens in one step (verified drafts): a stop string that ends inside them
            # ends the sample at that token, as steps of one token each would.
            for index in range(len(tokens)):
                last = index == len(tokens) - 1
                single = msgspec.structs.replace(
                    core_output,
                    new_token_ids=tokens[index : index + 1],
                    new_logprobs=(
                        core_output.new_logprobs[index : index + 1]
                        if core_output.new_logprobs
                        else None
                    ),
                    finish_reason=core_output.finish_reason if last else None,
                    stop_reason=core_output.stop_reason if last else None,
                    prompt_logprobs=core_output.prompt_logprobs if index == 0 else None,
                )
                if self._apply(state, sample, single, now):
                    return True
            return False
        completion = sample.completion
        metrics = state.output.metrics
        state.output.num_cached_tokens = core_output.num_cached_tokens
        if core_output.prompt_logprobs is not None and state.output.prompt_logprobs is None:
            state.output.prompt_logprobs = core_output.prompt_logprobs  # n samples: the first's
        if core_output.first_scheduled_time is not None and metrics.first_scheduled_time is None:
            metrics.first_scheduled_time = core_output.first_scheduled_time
        if core_output.new_token_ids:
            if metrics.first_token_time is None:
                metrics.first_token_time = core_output.first_token_time or now
            metrics.last_token_time = now
        completion.token_ids.extend(core_output.new_token_ids)
        completion.token_ids_delta.extend(core_output.new_token_ids)
        if core_output.new_logprobs and completion.logprobs is not None:
            if not state.deltas_only:
                completion.logprobs.extend(core_output.new_logprobs)
            completion.logprobs_delta.extend(core_output.new_logprobs)
        finishing = core_output.finish_reason is not None
        if sample.detokenizer is None:
            if finishing:
                completion.finish_reason = core_output.finish_reason
                completion.stop_reason = core_output.stop_reason
            return False
        if not self.stream_text and not sample.stop_checker.stop:
            if not finishing:
                return False
            new_token_ids = completion.token_ids  # all of them, decoded once
        else:
            new_token_ids = core_output.new_token_ids
        delta = sample.detokenizer.add_tokens(new_token_ids)
        if finishing:
            delta += sample.detokenizer.flush()
        result = sample.stop_checker.check(sample.detokenizer.text, len(delta), is_final=finishing)
        if result.matched:
            final_text = result.truncated_text
            completion.finish_reason = "stop"
            completion.stop_reason = result.stop_string
        else:
            final_text = sample.detokenizer.text[: result.safe_length]
            if finishing:
                completion.finish_reason = core_output.finish_reason
                completion.stop_reason = core_output.stop_reason
        completion.text_delta += final_text[sample.num_streamed_chars :]
        completion.text = final_text
        sample.num_streamed_chars = len(final_text)
        return result.matched

    def _finish_sample(self, state: _RequestState, child_id: str, now: float) -> None:
        del self._child_to_parent[child_id]
        state.num_finished += 1
        if state.num_finished == len(state.samples):
            state.output.finished = True
            state.output.metrics.finished_time = now
            del self._requests[state.output.request_id]

    def abort_request(self, request_id: str) -> list[str]:
        """Forget a request; returns the child ids the engine core must abort."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return []
        live = [child for child in state.child_ids if child in self._child_to_parent]
        for child in live:
            del self._child_to_parent[child]
        return live

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)
