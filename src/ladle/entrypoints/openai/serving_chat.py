"""POST /v1/chat/completions: messages through the tokenizer's chat template, a reply out,
streamed or whole."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ladle.engine.client import RequestStream
from ladle.entrypoints.openai.errors import BadRequestError
from ladle.entrypoints.openai.logprobs import chat_logprobs
from ladle.entrypoints.openai.protocol import (
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatResponseMessage,
    ChatStreamChoice,
)
from ladle.entrypoints.openai.sampling import build_sampling_params, resolve_max_tokens
from ladle.entrypoints.openai.serving_base import OpenAIServing
from ladle.entrypoints.openai.streaming import (
    SSE_DONE,
    DisconnectAwareStreamingResponse,
    sse_event,
)
from ladle.outputs import RequestOutput

# Template keywords a request may not override: they are the template call's own arguments.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "conversation", "tokenize", "add_generation_prompt", "return_dict",
     "return_tensors", "padding", "truncation", "max_length", "tokenizer_kwargs", "chat_template"}
)


class OpenAIServingChat(OpenAIServing):
    async def create(self, body: bytes, raw_request: Request) -> Response:
        request = self.parse_checked(ChatCompletionRequest, body)
        self._check_unsupported(request)
        prompt_token_ids = self._render(request)
        info = self.client.info
        max_tokens_param = (
            "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
        )
        max_tokens = resolve_max_tokens(
            request.max_completion_tokens if request.max_completion_tokens is not None
            else request.max_tokens,
            len(prompt_token_ids), info.max_model_len, "messages",
            max_tokens_param,
        )
        num_top = request.top_logprobs or 0
        params = build_sampling_params(
            request, max_tokens, num_top if request.logprobs else None,
            defaults=self.client.sampling_defaults, vocab_size=info.vocab_size,
        )
        stream = self.add_request("chatcmpl", None, prompt_token_ids, params, request.priority)
        response_id = f"chatcmpl-{uuid.uuid4().hex}"
        if request.stream:
            return DisconnectAwareStreamingResponse(
                self._stream(request, response_id, stream, len(prompt_token_ids)),
                on_close=stream.close,
            )
        output = await self.collect(raw_request, self._collect(stream), stream.close)
        return JSONResponse(
            self._response(request, response_id, output, len(prompt_token_ids)).model_dump()
        )

    # ----- request -----------------------------------------------------------------------------

    @staticmethod
    def _check_unsupported(request: ChatCompletionRequest) -> None:
        if request.top_logprobs is not None and not request.logprobs:
            raise BadRequestError("top_logprobs needs logprobs set to true", param="top_logprobs")
        if request.response_format is not None and request.response_format.type != "text":
            raise BadRequestError(
                f"response_format {request.response_format.type!r} is not supported",
                param="response_format",
            )
        if request.tools:
            raise BadRequestError("tools are not supported", param="tools")

    def _render(self, request: ChatCompletionRequest) -> list[int]:
        tokenizer = self.client.tokenizer
        if tokenizer is None:
            raise BadRequestError("this model has no tokenizer, so no chat template; use "
                                  "/v1/completions with token ids")
        template_kwargs = dict(request.chat_template_kwargs or {})
        reserved = RESERVED_TEMPLATE_KWARGS.intersection(template_kwargs)
        if reserved:
            raise BadRequestError(
                f"chat_template_kwargs may not set {', '.join(sorted(reserved))}",
                param="chat_template_kwargs",
            )
        messages = []
        for message in request.messages:
            entry = {"role": message.role, "content": message.text()}
            if message.name is not None:
                entry["name"] = message.name
            if message.tool_call_id is not None:
                entry["tool_call_id"] = message.tool_call_id
            messages.append(entry)
        try:
            return tokenizer.apply_chat_template(
                messages, add_generation_prompt=request.add_generation_prompt, **template_kwargs
            )
        except ValueError as error:
            raise BadRequestError(str(error), param="messages") from error
        except Exception as error:
            raise BadRequestError(
                f"the chat template failed on these messages: {type(error).__name__}: {error}",
                param="messages",
            ) from error

    # ----- response ----------------------------------------------------------------------------

    @staticmethod
    async def _collect(stream: RequestStream) -> RequestOutput:
        last = None
        async for last in stream:  # noqa: B007 - only the final output matters
            pass
        assert last is not None and last.finished
        return last

    def _response(
        self,
        request: ChatCompletionRequest,
        response_id: str,
        output: RequestOutput,
        num_prompt_tokens: int,
    ) -> ChatCompletionResponse:
        num_top = request.top_logprobs or 0
        choices = [
            ChatCompletionChoice(
                index=completion.index,
                message=ChatResponseMessage(content=completion.text),
                logprobs=(
                    chat_logprobs(completion.logprobs or [], self.token_texts, num_top)
                    if request.logprobs else None
                ),
                finish_reason=completion.finish_reason,
                stop_reason=completion.stop_reason,
            )
            for completion in output.outputs
        ]
        return ChatCompletionResponse(
            id=response_id,
            model=self.served_model_name,
            choices=choices,
            usage=self.usage([num_prompt_tokens], [output]),
        )

    async def _stream(
        self,
        request: ChatCompletionRequest,
        response_id: str,
        stream: RequestStream,
        num_prompt_tokens: int,
    ) -> AsyncIterator[str]:
        created = self.created()
        num_top = request.top_logprobs or 0
        include_usage = bool(request.stream_options and request.stream_options.include_usage)

        def chunk(choices: list[ChatStreamChoice]) -> str:
            return sse_event(
                ChatCompletionChunk(
                    id=response_id, created=created, model=self.served_model_name, choices=choices
                ).model_dump_json()
            )

        try:
            # OpenAI opens each choice with the role and empty content.
            for index in range(request.n):
                yield chunk([ChatStreamChoice(
                    index=index, delta=ChatDelta(role="assistant", content="")
                )])
            finish_sent = [False] * request.n
            final = None
            async for output in stream:
                choices = []
                for completion in output.outputs:
                    logprobs = None
                    if request.logprobs and completion.logprobs_delta:
                        logprobs = chat_logprobs(
                            completion.logprobs_delta, self.token_texts, num_top
                        )
                    finishing = (
                        completion.finish_reason is not None and not finish_sent[completion.index]
                    )
                    if not completion.text_delta and logprobs is None and not finishing:
                        continue
                    finish_sent[completion.index] = finish_sent[completion.index] or finishing
                    choices.append(
                        ChatStreamChoice(
                            index=completion.index,
                            delta=ChatDelta(content=completion.text_delta),
                            logprobs=logprobs,
                            finish_reason=completion.finish_reason if finishing else None,
                            stop_reason=completion.stop_reason if finishing else None,
                        )
                    )
                if choices:
                    yield chunk(choices)
                if output.finished:
                    final = output
            if include_usage and final is not None:
                yield sse_event(
                    ChatCompletionChunk(
                        id=response_id, created=created, model=self.served_model_name,
                        choices=[], usage=self.usage([num_prompt_tokens], [final]),
                    ).model_dump_json()
                )
            yield SSE_DONE
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - the status is sent; report in the stream
            yield self.generation_error(error).to_sse()
            yield SSE_DONE
        finally:
            stream.close()
