"""POST /v1/completions: prompts in, text out, streamed or whole.

A request with several prompts becomes one engine request per prompt (each with its n samples);
choice indices run prompt by prompt (prompt_index * n + sample index), as OpenAI numbers them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ladle.entrypoints.openai.errors import BadRequestError
from ladle.entrypoints.openai.kv_transfer_fields import check_kv_transfer_params
from ladle.entrypoints.openai.logprobs import (
    TokenTexts,
    completion_logprobs,
    completion_logprobs_fields,
)
from ladle.entrypoints.openai.prompt_options import (
    check_prompt_logprobs,
    echo_logprobs,
    join_logprobs,
    prompt_logprobs_json,
    truncate_prompt,
    usage_so_far,
    wants_continuous_usage,
)
from ladle.entrypoints.openai.protocol import (
    DEFAULT_MAX_TOKENS,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from ladle.entrypoints.openai.sampling import (
    build_sampling_params,
    check_token_ids,
    resolve_max_tokens,
)
from ladle.entrypoints.openai.serving_base import OpenAIServing
from ladle.entrypoints.openai.stream_chunks import ChunkEncoder, completion_choice
from ladle.entrypoints.openai.streaming import (
    SSE_DONE,
    DisconnectAwareStreamingResponse,
    merge_streams,
)
from ladle.entrypoints.openai.structured_fields import structured_outputs_of
from ladle.frontend.client import RequestStream
from ladle.frontend.tokenizer_required import needs_tokenizer
from ladle.outputs import RequestOutput
from ladle.sampling.params import SamplingParams


class OpenAIServingCompletion(OpenAIServing):
    async def create(self, body: bytes, raw_request: Request) -> Response:
        request = self.parse_checked(CompletionRequest, body)
        self._check_unsupported(request)
        check_prompt_logprobs(request.prompt_logprobs, request.stream)
        prompts = self._truncate(
            request, self._tokenize(request.prompt, request.add_special_tokens)
        )
        params_list = [self._params(request, token_ids) for _, token_ids in prompts]
        kv_params = check_kv_transfer_params(
            request.kv_transfer_params, self.client, n=request.n, stream=request.stream,
            wants_logprobs=request.logprobs is not None or request.prompt_logprobs is not None,
            num_prompts=len(prompts),
        )
        self.admit_batch(
            len(prompts) * request.n, sum(len(ids) for _, ids in prompts) * request.n
        )
        streams: list[RequestStream] = []
        try:
            for (text, token_ids), params in zip(prompts, params_list, strict=True):
                streams.append(
                    self.add_request("cmpl", text, token_ids, params, request.priority,
                                     admission_checked=True, stream=bool(request.stream),
                                     kv_transfer_params=kv_params)
                )
        except BaseException:
            for stream in streams:
                stream.close()
            raise
        response_id = f"cmpl-{uuid.uuid4().hex}"
        echo_texts = [self._echo_text(text, ids) if request.echo else "" for text, ids in prompts]
        prompt_lengths = [len(ids) for _, ids in prompts]

        def close_all() -> None:
            for stream in streams:
                stream.close()

        if request.stream:
            return DisconnectAwareStreamingResponse(
                self._stream(request, response_id, streams, echo_texts, prompt_lengths),
                on_close=close_all,
            )
        outputs = await self.collect(raw_request, self._collect(streams), close_all)
        return JSONResponse(
            self._response(request, response_id, outputs, echo_texts, prompt_lengths).model_dump()
        )

    # ----- request -----------------------------------------------------------------------------

    @staticmethod
    def _check_unsupported(request: CompletionRequest) -> None:
        if request.suffix:
            raise BadRequestError("suffix is not supported", param="suffix")
        if request.best_of is not None and request.best_of != request.n:
            raise BadRequestError("best_of other than n is not supported", param="best_of")

    def _tokenize(
        self, prompt: str | list[str] | list[int] | list[list[int]], add_special_tokens: bool = True
    ) -> list[tuple[str | None, list[int]]]:
        """(text, token ids) of each prompt."""
        if isinstance(prompt, str):
            items: list = [prompt]
        elif prompt and isinstance(prompt[0], int):
            items = [prompt]
        else:
            items = list(prompt)
        if not items:
            raise BadRequestError("prompt must not be an empty list", param="prompt")
        vocab_size = self.client.info.vocab_size
        tokenizer = self.client.tokenizer
        result = []
        for item in items:
            if isinstance(item, str):
                if tokenizer is None:
                    raise BadRequestError(
                        needs_tokenizer("text prompts", self.client.no_tokenizer_reason)
                        + "; send token ids as the prompt",
                        param="prompt",
                    )
                result.append((item, tokenizer.encode(item, add_special_tokens)))
            else:
                check_token_ids(item, vocab_size, "prompt")
                result.append((None, list(item)))
        return result

    def _truncate(
        self, request: CompletionRequest, prompts: list[tuple[str | None, list[int]]]
    ) -> list[tuple[str | None, list[int]]]:
        """truncate_prompt_tokens: a prompt cut short loses its text (echo decodes the ids)."""
        truncated = []
        for text, token_ids in prompts:
            kept = truncate_prompt(
                token_ids, request.truncate_prompt_tokens, self.client.info.max_model_len
            )
            truncated.append((text if len(kept) == len(token_ids) else None, kept))
        return truncated

    def _params(self, request: CompletionRequest, token_ids: list[int]) -> SamplingParams:
        info = self.client.info
        # An explicit null is OpenAI's default (16), as an absent field is.
        requested = DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens
        max_tokens = resolve_max_tokens(
            requested, len(token_ids), info.max_model_len, "prompt",
            ceiling=self.client.sampling_defaults.get("max_tokens"),
        )
        params = build_sampling_params(
            request,
            max_tokens,
            request.logprobs,
            structured_outputs_of(request),
            defaults=self.client.sampling_defaults,
            vocab_size=info.vocab_size,
        )
        if request.echo and request.logprobs is not None:
            # echo with logprobs gives the prompt tokens' logprobs too, as OpenAI does.
            wanted = max(request.logprobs, request.prompt_logprobs or 0)
            params = dataclasses.replace(params, prompt_logprobs=wanted)
        return params

    def _echo_logprobs(self, request: CompletionRequest, output: RequestOutput):
        return echo_logprobs(
            output.prompt_token_ids, output.prompt_logprobs, self.logprob_names(request),
            request.logprobs,
        )

    def _echo_text(self, text: str | None, token_ids: list[int]) -> str:
        if text is not None:
            return text
        tokenizer = self.client.tokenizer
        return tokenizer.decode(token_ids) if tokenizer is not None else ""

    # ----- response ----------------------------------------------------------------------------

    @staticmethod
    async def _collect(streams: list[RequestStream]) -> list[RequestOutput]:
        finals: list[RequestOutput | None] = [None] * len(streams)
        async for index, output in merge_streams(streams):
            if output.finished:
                finals[index] = output
        return [output for output in finals if output is not None]

    def _response(
        self,
        request: CompletionRequest,
        response_id: str,
        outputs: list[RequestOutput],
        echo_texts: list[str],
        prompt_lengths: list[int],
    ) -> CompletionResponse:
        choices = []
        num_top = request.logprobs or 0
        for prompt_index, output in enumerate(outputs):
            for completion in output.outputs:
                logprobs = None
                if request.logprobs is not None:
                    echoed = self._echo_logprobs(request, output) if request.echo else None
                    names = self.logprob_names(request)
                    logprobs = completion_logprobs(
                        completion.logprobs or [], names, num_top,
                        _end_offset(echoed, output.prompt_token_ids, names),
                    )
                    if echoed is not None:
                        logprobs = join_logprobs(echoed, logprobs)
                choices.append(
                    CompletionChoice(
                        index=prompt_index * request.n + completion.index,
                        text=echo_texts[prompt_index] + completion.text,
                        logprobs=logprobs,
                        finish_reason=completion.finish_reason,
                        stop_reason=completion.stop_reason,
                        prompt_logprobs=prompt_logprobs_json(
                            output.prompt_logprobs, self.token_texts
                        )
                        if request.prompt_logprobs is not None
                        else None,
                        prompt_token_ids=list(output.prompt_token_ids)
                        if request.return_token_ids
                        else None,
                        token_ids=list(completion.token_ids) if request.return_token_ids else None,
                    )
                )
        return CompletionResponse(
            id=response_id,
            model=self.served_model_name,
            choices=choices,
            usage=self.usage(prompt_lengths, outputs),
            kv_transfer_params=outputs[0].kv_transfer_params if len(outputs) == 1 else None,
        )

    async def _stream(
        self,
        request: CompletionRequest,
        response_id: str,
        streams: list[RequestStream],
        echo_texts: list[str],
        prompt_lengths: list[int],
    ) -> AsyncIterator[bytes | str]:
        created = self.created()
        n = request.n
        num_top = request.logprobs or 0
        num_choices = len(streams) * n
        text_offsets = [0] * num_choices
        echo_pending = [bool(echo_texts[i // n]) for i in range(num_choices)]
        finish_sent = [False] * num_choices
        # return_token_ids: a choice's first chunk carries the prompt's ids.
        prompt_ids_pending = [request.return_token_ids] * num_choices
        finals: list[RequestOutput | None] = [None] * len(streams)
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        continuous_usage = wants_continuous_usage(request.stream_options)
        chunks = ChunkEncoder(response_id, "text_completion", created, self.served_model_name)
        try:
            async for prompt_index, output in merge_streams(streams):
                choices = []
                for completion in output.outputs:
                    index = prompt_index * n + completion.index
                    text = completion.text_delta
                    echoed = None
                    if echo_pending[index]:
                        text = echo_texts[prompt_index] + text
                        echo_pending[index] = False
                        if request.logprobs is not None:
                            echoed = self._echo_logprobs(request, output)
                            # logprob offsets run on through the prompt tokens' own texts
                            text_offsets[index] = _end_offset(
                                echoed, output.prompt_token_ids, self.logprob_names(request)
                            )
                    logprobs = None
                    if request.logprobs is not None and completion.logprobs_delta:
                        names = self.logprob_names(request)
                        logprobs = completion_logprobs_fields(
                            completion.logprobs_delta, names, num_top, text_offsets[index]
                        )
                        # On past these tokens' own texts, as the whole response counts them:
                        # the streamed text may hold back a token's partial character, and
                        # offsets must not depend on how the tokens fell into chunks.
                        last_token_id = completion.logprobs_delta[-1].token_id
                        text_offsets[index] = logprobs["text_offset"][-1] + len(
                            names.text(last_token_id)
                        )
                    if echoed is not None:
                        generated = CompletionLogprobs(**logprobs) if logprobs else None
                        logprobs = join_logprobs(
                            echoed, generated or CompletionLogprobs()
                        ).model_dump()
                    finishing = completion.finish_reason is not None and not finish_sent[index]
                    new_ids = completion.token_ids_delta if request.return_token_ids else []
                    if not text and logprobs is None and not finishing and not new_ids:
                        continue
                    finish_sent[index] = finish_sent[index] or finishing
                    prompt_ids = None
                    if prompt_ids_pending[index]:
                        prompt_ids = list(output.prompt_token_ids)
                        prompt_ids_pending[index] = False
                    choices.append(
                        completion_choice(
                            index,
                            text,
                            logprobs,
                            completion.finish_reason if finishing else None,
                            completion.stop_reason if finishing else None,
                            prompt_ids,
                            list(new_ids) if request.return_token_ids else None,
                        )
                    )
                if output.finished:
                    finals[prompt_index] = output
                if choices:
                    usage = None
                    if continuous_usage:
                        usage = usage_so_far(
                            prompt_lengths[prompt_index],
                            sum(len(c.token_ids) for c in output.outputs),
                        ).model_dump()
                    yield chunks.event(choices, usage)
            if include_usage:
                done = [output for output in finals if output is not None]
                yield chunks.event([], self.usage(prompt_lengths, done).model_dump())
            yield SSE_DONE
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - the status is sent; report in the stream
            yield self.generation_error(error).to_sse()
            yield SSE_DONE
        finally:
            for stream in streams:
                stream.close()


def _end_offset(
    logprobs: CompletionLogprobs | None, token_ids: list[int], names: TokenTexts
) -> int:
    """Where the text after these tokens (token_ids, which logprobs describe) starts: the last
    one's offset plus its text's length, not its name's (a `token_id:N` label is no text);
    0 without them."""
    if logprobs is None or not logprobs.tokens:
        return 0
    return logprobs.text_offset[-1] + len(names.text(token_ids[-1]))
