"""LLM: offline batch generation on the same engine core the server uses, in-process."""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Iterator, Sequence

from ladle.config import EngineConfig
from ladle.engine.engine_core import EngineCore
from ladle.engine.gc_policy import collector_paused_during_run
from ladle.entrypoints.chat_messages import check_chat_options, text_only_conversation
from ladle.entrypoints.chat_template import load_chat_template
from ladle.entrypoints.metrics_reader import Metric, OfflineTotals, metrics_snapshot
from ladle.entrypoints.progress import GenerationProgress
from ladle.entrypoints.prompt_inputs import (
    PromptType,
    as_prompt_list,
    cache_salt_of,
    split_prompt,
)
from ladle.entrypoints.vllm_outputs import finish_offline_output
from ladle.frontend.output_processor import OutputProcessor
from ladle.frontend.tokenizer_preload import TokenizerPreload
from ladle.frontend.tokenizer_required import needs_tokenizer, no_tokenizer_reason
from ladle.model.default_model import resolve_default_model
from ladle.model.end_tokens import model_end_token_ids
from ladle.model.generation_defaults import sampling_defaults_of
from ladle.outputs import CompletionOutput, RequestMetrics, RequestOutput
from ladle.sampling.params import SamplingParams

PromptInput = PromptType


class RequestErrors(ValueError):
    """Some requests of a generate()/chat() call could not run. The others did: `outputs` holds
    every request's RequestOutput in input order, the failed ones with finish_reason 'error' and
    their reason in `.error`."""

    def __init__(self, message: str, outputs: list[RequestOutput]) -> None:
        super().__init__(message)
        self.outputs = outputs


class LLM:
    """Offline generation.

    LLM() runs the embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF); LLM(model=path)
    a Hugging Face folder or a .gguf file; LLM(model='qwen3-0.6b', load_format='dummy') random
    weights of a named shape, with the default model's tokenizer unless tokenizer= names one.
    skip_tokenizer_init=True (vLLM's) loads no tokenizer: prompts are token ids and outputs
    carry token ids with empty text.
    Engine options (dtype, block_size, max_num_batched_tokens,
    max_num_seqs, gpu_memory_utilization, max_model_len, num_kv_blocks, ...) go as keywords.
    """

    def __init__(self, model: str | os.PathLike | None = None, **engine_options) -> None:
        if model is None and engine_options.get("load_format", "auto") != "dummy":
            model = str(resolve_default_model())
        self.config = EngineConfig.from_kwargs(model=model, **engine_options)
        # The tokenizer loads on a thread while the engine loads the model.
        tokenizer_preload = TokenizerPreload(self.config.model)
        try:
            self.engine = EngineCore(self.config)
        except BaseException:
            tokenizer_preload.cancel()
            raise
        self.tokenizer = tokenizer_preload.result(
            self.engine.info.model_path, self.engine.info.arch
        )
        eos_token_ids = (
            self.tokenizer.eos_token_ids
            if self.tokenizer
            else model_end_token_ids(self.engine.info.arch, self.engine.info.model_path)
        )
        self._no_tokenizer_reason = no_tokenizer_reason(self.config.model.skip_tokenizer_init)
        self.output_processor = OutputProcessor(
            self.tokenizer, eos_token_ids, stream_text=False,
            no_tokenizer_reason=self._no_tokenizer_reason,
        )
        self.sampling_defaults = sampling_defaults_of(
            self.engine.info.model_path, self.config.model.generation_config,
            self.config.model.override_generation_config,
        )

        # stream() decodes text at every step; generate() only once per finished sample.
        self._stream_processor = OutputProcessor(
            self.tokenizer, eos_token_ids, stream_text=True,
            no_tokenizer_reason=self._no_tokenizer_reason,
        )
        self._request_counter = itertools.count()
        self._totals = OfflineTotals()

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation-config defaults (used when generate()
        or chat() get sampling_params=None), as vLLM's method of the same name."""
        return SamplingParams(**self.sampling_defaults)

    def get_metrics(self) -> list[Metric]:
        """The engine's counters and gauges now, as vLLM's LLM.get_metrics() returns them
        (metrics_reader.py: Counter, Gauge, Vector; names as on `ladle serve`'s /metrics
        without `_total`), e.g. speculative decoding's drafts and accepted tokens."""
        return metrics_snapshot(self.engine.get_stats(), self._totals)

    def get_tokenizer(self):
        """The model's Hugging Face tokenizer (encode, decode, apply_chat_template, ...), as
        vLLM's LLM.get_tokenizer() returns; None for dummy weights without one. ladle's own
        wrapper, with the end-of-generation ids, is `llm.tokenizer`."""
        return self.tokenizer.hf_tokenizer if self.tokenizer is not None else None

    # ----- public API ----------------------------------------------------------------------

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        raise_on_error: bool = True,
        lora_request: None = None,
    ) -> list[RequestOutput]:
        """Generate for prompts: strings, token-id lists, or vLLM's TextPrompt / TokensPrompt
        dicts ({"prompt": ...} / {"prompt_token_ids": [...]}), one or a list; outputs come back
        in input order.

        A request that cannot run (empty prompt, too long, ...) does not stop the others: they
        complete, and then RequestErrors (a ValueError) names each problem, carrying all
        outputs. With raise_on_error=False the outputs are returned and the failed ones have
        finish_reason 'error' and `.error` set.
        """
        _refuse_lora(lora_request)
        prompt_list = as_prompt_list(prompts)
        encoded = [self._encode_prompt(prompt) for prompt in prompt_list]
        salts = [cache_salt_of(prompt) for prompt in prompt_list]
        if any(salt is not None for salt in salts):
            # vLLM takes the salt with the prompt; ladle's engine takes it with the params.
            params_list = _broadcast_params(
                sampling_params or self.get_default_sampling_params(), len(prompt_list)
            )
            sampling_params = [
                params if salt is None else dataclasses.replace(params, cache_salt=salt)
                for params, salt in zip(params_list, salts, strict=True)
            ]
        return self._run(encoded, sampling_params, use_tqdm, priority, raise_on_error)

    def chat(
        self,
        messages: list[dict] | Sequence[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: None = None,
        chat_template: str | os.PathLike | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
        raise_on_error: bool = True,
    ) -> list[RequestOutput]:
        """Generate replies to conversations (one list of {'role', 'content'} dicts each; content
        a string or OpenAI's text parts), formatted by the tokenizer's chat template, or by
        `chat_template` (a Jinja template or a file holding one, as vLLM's LLM.chat and
        --chat-template take it). vLLM's arguments, in vLLM's order: `continue_final_message`
        (with add_generation_prompt=False) extends the last assistant message, `tools` reach
        the template as its `tools` variable (the reply is the raw text, as vLLM's offline
        chat returns it), `chat_template_content_format` 'auto' | 'string' | 'openai' (all
        render text parts alike) and `lora_request` None (ladle has no LoRA adapters)."""
        _refuse_lora(lora_request)
        check_chat_options(
            add_generation_prompt, continue_final_message, chat_template_content_format
        )
        template_kwargs = dict(chat_template_kwargs or {})
        if chat_template is not None:
            template_kwargs["chat_template"] = load_chat_template(chat_template)
        if continue_final_message:
            template_kwargs["continue_final_message"] = True
        if tools is not None:
            template_kwargs["tools"] = tools
        encoded = self._encode_conversations(messages, add_generation_prompt, template_kwargs)
        return self._run(encoded, sampling_params, use_tqdm, None, raise_on_error)

    def stream(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        chat: bool = False,
    ) -> Iterator[tuple[int, RequestOutput]]:
        """Run prompts (conversations when chat=True) as one batch, yielding
        (prompt index, RequestOutput) whenever a request's output grows: after each engine
        step, with that step's text in `.outputs[i].text_delta`. A prompt that cannot run
        comes once, finished, with `.error` set. Closing the iterator early (or Ctrl-C) aborts
        the requests still running."""
        if chat:
            encoded = self._encode_conversations(prompts, True, None)
        else:
            encoded = [self._encode_prompt(prompt) for prompt in as_prompt_list(prompts)]
        params_list = _broadcast_params(sampling_params, len(encoded))
        index_of: dict[str, int] = {}
        for index, ((text, token_ids, error), params) in enumerate(zip(encoded, params_list)):
            request_id = str(next(self._request_counter))
            arrival = time.monotonic()
            if error is None:
                error = self._submit(
                    request_id, text, token_ids, params, arrival, 0, self._stream_processor
                )
            if error is not None:
                yield index, _error_output(request_id, text, token_ids, params, arrival, error)
            else:
                index_of[request_id] = index
        running = set(index_of)
        try:
            while running and self.engine.has_unfinished_requests():
                core_outputs = self.engine.step()
                request_outputs, to_abort = self._stream_processor.process_outputs(core_outputs)
                if to_abort:
                    self.engine.abort_requests(to_abort)
                for output in request_outputs:
                    if output.finished:
                        self._totals.record_finished(output)
                        running.discard(output.request_id)
                    yield index_of[output.request_id], output
        finally:
            for request_id in running:
                self.engine.abort_requests(self._stream_processor.abort_request(request_id))

    def _encode_conversations(
        self,
        messages: list[dict] | Sequence[list[dict]],
        add_generation_prompt: bool,
        chat_template_kwargs: dict | None,
    ) -> list[tuple[str | None, list[int] | None, str | None]]:
        if self.tokenizer is None:
            raise ValueError(
                needs_tokenizer("chat (its chat template)", self._no_tokenizer_reason)
            )
        if isinstance(messages, list) and messages and isinstance(messages[0], dict):
            conversations = [messages]
        else:
            conversations = list(messages)
        encoded = []
        for conversation in conversations:
            try:
                token_ids = self.tokenizer.apply_chat_template(
                    text_only_conversation(conversation),
                    add_generation_prompt=add_generation_prompt,
                    **(chat_template_kwargs or {}),
                )
                encoded.append((None, token_ids, None))
            except ValueError as error:
                encoded.append((None, None, str(error)))
        return encoded

    # ----- internals -----------------------------------------------------------------------

    def _encode_prompt(
        self, prompt: PromptInput
    ) -> tuple[str | None, list[int] | None, str | None]:
        """(prompt text, token ids, error)"""
        try:
            text, token_ids = split_prompt(prompt)
        except ValueError as error:
            return None, None, str(error)
        if token_ids is not None:
            return text, token_ids, None
        if self.tokenizer is None:
            reason = self._no_tokenizer_reason
            return text, None, needs_tokenizer("text prompts", reason) + (
                '; pass {"prompt_token_ids": [...]}'
            )
        return text, self.tokenizer.encode(text), None

    def _run(
        self,
        encoded: list[tuple[str | None, list[int] | None, str | None]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
        priority: Sequence[int] | None,
        raise_on_error: bool,
    ) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params_list = _broadcast_params(sampling_params, len(encoded))
        encoded = [
            _truncate(entry, params.truncate_prompt_tokens, self.engine.max_model_len)
            for entry, params in zip(encoded, params_list)
        ]
        if priority is not None and len(priority) != len(encoded):
            raise ValueError(f"priority has {len(priority)} entries for {len(encoded)} prompts")
        results: dict[str, RequestOutput] = {}
        order: list[str] = []
        for index, ((text, token_ids, error), params) in enumerate(zip(encoded, params_list)):
            request_id = str(next(self._request_counter))
            order.append(request_id)
            arrival = time.monotonic()
            if error is None:
                error = self._submit(
                    request_id,
                    text,
                    token_ids,
                    params,
                    arrival,
                    priority[index] if priority is not None else 0,
                )
            if error is not None:
                results[request_id] = _error_output(
                    request_id, text, token_ids, params, arrival, error
                )

        # The most each request can generate: the bar's total shrinks as requests end early.
        max_tokens_of = {
            request_id: self._token_budget(params, token_ids)
            for request_id, (_, token_ids, _), params in zip(order, encoded, params_list)
            if request_id not in results
        }
        progress = GenerationProgress(len(order), sum(max_tokens_of.values()), enabled=use_tqdm)
        for _ in results:
            progress.finish_prompt(0)
        try:
            with collector_paused_during_run():
                self._drive(results, progress, max_tokens_of)
        except BaseException:
            # Ctrl-C or a bug: leave no request of this call behind to run inside the next one.
            for request_id in order:
                if request_id not in results:
                    self.engine.abort_requests(self.output_processor.abort_request(request_id))
            raise
        finally:
            progress.close()
        outputs = [results[request_id] for request_id in order]
        decode = self._decode_token if self.tokenizer is not None else (lambda token_id: None)
        for output, params in zip(outputs, params_list):
            finish_offline_output(output, params, decode)
        errors = [
            f"request {index}: {output.error}"
            for index, output in enumerate(outputs)
            if output.error is not None
        ]
        if errors and raise_on_error:
            raise RequestErrors("; ".join(errors), outputs)
        return outputs

    def _drive(
        self,
        results: dict[str, RequestOutput],
        progress: GenerationProgress,
        max_tokens_of: dict[str, int],
    ) -> None:
        """Step the engine until every submitted request has finished."""
        while self.engine.has_unfinished_requests():
            core_outputs = self.engine.step()
            request_outputs, to_abort = self.output_processor.process_outputs(core_outputs)
            if to_abort:
                self.engine.abort_requests(to_abort)
            for output in request_outputs:
                progress.add_tokens(sum(len(c.token_ids_delta) for c in output.outputs))
                if output.finished:
                    self._totals.record_finished(output)
                    results[output.request_id] = output
                    num_generated = sum(len(c.token_ids) for c in output.outputs)
                    progress.finish_prompt(max_tokens_of[output.request_id] - num_generated)
            progress.step_done()

    def _token_budget(self, params: SamplingParams, token_ids: list[int] | None) -> int:
        room = self.engine.max_model_len - len(token_ids or [])
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        return max(max_tokens, 0) * params.n

    def _decode_token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _submit(
        self,
        request_id: str,
        text: str | None,
        token_ids: list[int],
        params: SamplingParams,
        arrival: float,
        priority: int,
        processor: OutputProcessor | None = None,
    ) -> str | None:
        """Queue one request (and its n samples); returns the reason if it cannot run."""
        processor = processor or self.output_processor
        added = []
        try:
            core_requests = processor.add_request(
                request_id, text, token_ids, params, arrival, priority
            )
            for core_request in core_requests:
                self.engine.add_request(core_request)
                added.append(core_request.request_id)
        except ValueError as error:
            self.engine.abort_requests(added)
            processor.abort_request(request_id)
            return str(error)
        return None


def _truncate(
    entry: tuple[str | None, list[int] | None, str | None],
    truncate_prompt_tokens: int | None,
    max_model_len: int | None,
) -> tuple[str | None, list[int] | None, str | None]:
    """Keep the last k prompt tokens (vLLM's truncate_prompt_tokens; -1: max_model_len)."""
    text, token_ids, error = entry
    if truncate_prompt_tokens is None or token_ids is None:
        return entry
    keep = max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
    if keep is None or len(token_ids) <= keep:
        return entry
    # The text no longer matches the ids it came from: drop it, as vLLM does.
    return None, token_ids[-keep:], error


def _refuse_lora(lora_request: object) -> None:
    """vLLM scripts pass lora_request=None; an adapter is refused by name (no LoRA in ladle)."""
    if lora_request is not None:
        raise ValueError("lora_request: ladle has no LoRA adapters; pass None")


def _broadcast_params(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, count: int
) -> list[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * count
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * count
    params = list(sampling_params)
    if len(params) != count:
        raise ValueError(f"got {len(params)} sampling params for {count} prompts")
    return params


def _error_output(
    request_id: str,
    text: str | None,
    token_ids: list[int] | None,
    params: SamplingParams,
    arrival: float,
    error: str,
) -> RequestOutput:
    return RequestOutput(
        request_id=request_id,
        prompt=text,
        prompt_token_ids=token_ids or [],
        outputs=[CompletionOutput(index=i, finish_reason="error") for i in range(params.n)],
        finished=True,
        metrics=RequestMetrics(arrival_time=arrival, finished_time=time.monotonic()),
        error=error,
    )
