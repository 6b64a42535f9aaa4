"""POST /v1/chat/completions: messages through the tokenizer's chat template, a reply out,
streamed or whole."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ladle.entrypoints.openai.chat_reply import ChoiceStream, ReplyShaper
from ladle.entrypoints.openai.errors import BadRequestError
from ladle.entrypoints.openai.kv_transfer_fields import check_kv_transfer_params
from ladle.entrypoints.openai.logprobs import chat_logprobs
from ladle.entrypoints.openai.prompt_options import (
    chat_echo_text,
    check_chat_prompt_options,
    check_prompt_logprobs,
    prompt_logprobs_json,
    truncate_prompt,
    usage_so_far,
    wants_continuous_usage,
)
from ladle.entrypoints.openai.protocol import (
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatResponseMessage,
    ChatStreamChoice,
)
from ladle.entrypoints.openai.reasoning_parsers import select_reasoning_parser
from ladle.entrypoints.openai.sampling import build_sampling_params, resolve_max_tokens
from ladle.entrypoints.openai.serving_base import OpenAIServing
from ladle.entrypoints.openai.stream_chunks import ChunkEncoder, chat_choice
from ladle.entrypoints.openai.streaming import (
    SSE_DONE,
    DisconnectAwareStreamingResponse,
)
from ladle.entrypoints.openai.structured_fields import structured_outputs_of
from ladle.entrypoints.openai.tool_calling import (
    build_template_messages,
    plan_tools,
    template_knows_tools,
)
from ladle.entrypoints.openai.tool_parsers import select_tool_parser
from ladle.frontend.client import AsyncEngineClient, RequestStream
from ladle.frontend.tokenizer_required import needs_tokenizer
from ladle.outputs import RequestOutput
from ladle.sampling.params import MAX_LOGPROBS

# Template keywords a request may not override: they are the template call's own arguments.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "conversation", "tokenize", "add_generation_prompt", "return_dict",
     "return_tensors", "padding", "truncation", "max_length", "tokenizer_kwargs", "chat_template"}
)


class OpenAIServingChat(OpenAIServing):
    def __init__(
        self,
        client: AsyncEngineClient,
        served_model_name: str,
        allow_unknown_fields: bool = False,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        response_role: str = "assistant",
        return_tokens_as_token_ids: bool = False,
    ) -> None:
        """response_role: vLLM's --response-role, the role of the reply's message."""
        super().__init__(
            client, served_model_name, allow_unknown_fields, return_tokens_as_token_ids
        )
        self.response_role = response_role
        template = client.tokenizer.hf_tokenizer.chat_template if client.tokenizer else None
        template = template if isinstance(template, str) else None
        self.tool_parser = select_tool_parser(tool_call_parser, template)
        self.reasoning_parser = select_reasoning_parser(reasoning_parser, template)
        self.template_has_tools = template_knows_tools(template)

    async def create(self, body: bytes, raw_request: Request) -> Response:
        request = self.parse_checked(ChatCompletionRequest, body)
        self._check_unsupported(request)
        check_chat_prompt_options(request)
        check_prompt_logprobs(request.prompt_logprobs, request.stream)
        plan = plan_tools(request, self.tool_parser)
        structured = structured_outputs_of(request)
        if plan.is_forced and structured is not None:
            raise BadRequestError(
                "tool_choice required or a named function cannot be combined with "
                "response_format or structured_outputs", param="tool_choice",
            )
        structured = plan.structured_outputs or structured
        prompt_text, prompt_token_ids = self.render(request, plan)
        prompt_token_ids = truncate_prompt(
            prompt_token_ids, request.truncate_prompt_tokens, self.client.info.max_model_len
        )
        reasoning = self.reasoning_parser
        starts_in_reasoning = reasoning is not None and reasoning.starts_in_reasoning(prompt_text)
        # Reasoning comes first, unconstrained; the grammar starts after </think>, unless the
        # template already closed the block (thinking switched off).
        if structured is not None and reasoning is not None and (
            starts_in_reasoning or prompt_text.rfind(reasoning.end_tag) < 0
        ):
            structured.reasoning_end_token_ids = self.client.tokenizer.encode(
                reasoning.end_tag, add_special_tokens=False
            )
        shaper = ReplyShaper(plan, reasoning, starts_in_reasoning)
        info = self.client.info
        max_tokens_param = (
            "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
        )
        max_tokens = resolve_max_tokens(
            request.max_completion_tokens if request.max_completion_tokens is not None
            else request.max_tokens,
            len(prompt_token_ids), info.max_model_len, "messages",
            max_tokens_param, ceiling=self.client.sampling_defaults.get("max_tokens"),
        )
        num_top = request.top_logprobs or 0
        params = build_sampling_params(
            request, max_tokens, num_top if request.logprobs else None, structured,
            defaults=self.client.sampling_defaults, vocab_size=info.vocab_size,
        )
        kv_params = check_kv_transfer_params(
            request.kv_transfer_params, self.client, n=request.n, stream=request.stream,
            wants_logprobs=bool(request.logprobs) or request.prompt_logprobs is not None,
        )
        stream = self.add_request(
            "chatcmpl", None, prompt_token_ids, params, request.priority,
            stream=bool(request.stream), kv_transfer_params=kv_params,
        )
        response_id = f"chatcmpl-{uuid.uuid4().hex}"
        if request.stream:
            return DisconnectAwareStreamingResponse(
                self._stream(request, response_id, stream, prompt_token_ids, shaper),
                on_close=stream.close,
            )
        output = await self.collect(raw_request, self._collect(stream), stream.close)
        return JSONResponse(
            self._response(request, response_id, output, prompt_token_ids, shaper).model_dump()
        )

    # ----- request -----------------------------------------------------------------------------

    @staticmethod
    def _check_unsupported(request: ChatCompletionRequest) -> None:
        if request.top_logprobs is not None and not 0 <= request.top_logprobs <= MAX_LOGPROBS:
            raise BadRequestError(
                f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {request.top_logprobs}",
                param="top_logprobs",
            )
        if request.top_logprobs is not None and not request.logprobs:
            raise BadRequestError("top_logprobs needs logprobs set to true", param="top_logprobs")

    def render(self, request: ChatCompletionRequest, plan) -> tuple[str, list[int]]:
        """The prompt's text and token ids (also /tokenize's, serving_tokenization.py)."""
        tokenizer = self.client.tokenizer
        if tokenizer is None:
            raise BadRequestError(
                needs_tokenizer("chat completions (a chat template)",
                                self.client.no_tokenizer_reason)
                + "; use /v1/completions with token ids"
            )
        template_kwargs = dict(request.chat_template_kwargs or {})
        reserved = RESERVED_TEMPLATE_KWARGS.intersection(template_kwargs)
        if reserved:
            raise BadRequestError(
                f"chat_template_kwargs may not set {', '.join(sorted(reserved))}",
                param="chat_template_kwargs",
            )
        for message_index, message in enumerate(request.messages):
            if (unsupported := message.first_non_text_part()) is not None:
                part_index, part_type = unsupported
                raise BadRequestError(
                    f"non-text content parts are not supported (messages[{message_index}]"
                    f".content[{part_index}] has type {part_type!r}); this server serves "
                    "text-only models",
                    param=f"messages.{message_index}.content.{part_index}.type",
                )
        messages, tools = build_template_messages(
            request, self.tool_parser, self.template_has_tools
        )
        if tools is not None:
            template_kwargs["tools"] = tools
        try:
            if request.continue_final_message:
                template_kwargs["continue_final_message"] = True
            text = tokenizer.render_chat_template(
                messages, add_generation_prompt=request.add_generation_prompt, **template_kwargs
            )
            return text, tokenizer.encode(text, add_special_tokens=request.add_special_tokens)
        except ValueError as error:
            raise BadRequestError(str(error), param="messages") from error
        except Exception as error:
            raise BadRequestError(
                f"the chat template failed on these messages: {type(error).__name__}: {error}",
                param="messages",
            ) from error

    # ----- response ----------------------------------------------------------------------------

    def reply_role(self, request: ChatCompletionRequest) -> str:
        """As vLLM: the server's response role when the template adds a generation prompt;
        otherwise the reply continues the last message (continue_final_message), so it is that
        message's role."""
        if request.add_generation_prompt:
            return self.response_role
        return request.messages[-1].role

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
        prompt_token_ids: list[int],
        shaper: ReplyShaper,
    ) -> ChatCompletionResponse:
        """return_token_ids: the generated ids are the raw ones, whatever the reasoning and
        tool parsers made of their text (echo's text has no ids: it is the prompt's)."""
        num_top = request.top_logprobs or 0
        role = self.reply_role(request)
        echo = chat_echo_text(request, role)
        names = self.logprob_names(request)
        choices = []
        for completion in output.outputs:
            message = ChatResponseMessage(content=completion.text)
            finish_reason = completion.finish_reason
            if not shaper.is_plain:
                message, finish_reason = shaper.whole(completion.text, finish_reason)
            message.role = role
            if echo:
                message.content = echo + (message.content or "")
            choices.append(ChatCompletionChoice(
                index=completion.index,
                message=message,
                logprobs=(
                    chat_logprobs(completion.logprobs or [], names, num_top)
                    if request.logprobs else None
                ),
                finish_reason=finish_reason,
                stop_reason=completion.stop_reason,
                token_ids=list(completion.token_ids) if request.return_token_ids else None,
            ))
        return ChatCompletionResponse(
            id=response_id,
            model=self.served_model_name,
            choices=choices,
            usage=self.usage([len(prompt_token_ids)], [output]),
            kv_transfer_params=output.kv_transfer_params,
            prompt_logprobs=prompt_logprobs_json(output.prompt_logprobs, self.token_texts),
            prompt_token_ids=list(prompt_token_ids) if request.return_token_ids else None,
        )

    async def _stream(
        self,
        request: ChatCompletionRequest,
        response_id: str,
        stream: RequestStream,
        prompt_token_ids: list[int],
        shaper: ReplyShaper,
    ) -> AsyncIterator[bytes | str]:
        """return_token_ids: as vLLM, each choice's opening chunk carries the prompt's ids
        (once with n = 1), and every step that adds ids sends them on its choice, even when the
        parsers hold the text back (an empty delta), so a stream's ids add up to the whole
        reply's."""
        created = self.created()
        num_prompt_tokens = len(prompt_token_ids)
        return_ids = request.return_token_ids
        num_top = request.top_logprobs or 0
        names = self.logprob_names(request)
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        continuous_usage = wants_continuous_usage(request.stream_options)
        num_completion_tokens = 0

        chunks = ChunkEncoder(
            response_id, "chat.completion.chunk", created, self.served_model_name
        )

        def chunk(
            choices: list[dict | ChatStreamChoice], prompt_ids: list[int] | None = None
        ) -> bytes:
            usage = None
            if continuous_usage:
                usage = usage_so_far(num_prompt_tokens, num_completion_tokens).model_dump()
            return chunks.event(choices, usage, prompt_ids)

        try:
            # OpenAI opens each choice with the role and empty content (echo: the echoed text).
            role = self.reply_role(request)
            echo = chat_echo_text(request, role)
            opening_ids = list(prompt_token_ids) if return_ids else None
            for index in range(request.n):
                yield chunk([chat_choice(index, {"role": role, "content": echo})], opening_ids)
            finish_sent = [False] * request.n
            shaped = None if shaper.is_plain else [shaper.stream() for _ in range(request.n)]
            final = None
            async for output in stream:
                choices = []
                num_completion_tokens = sum(len(c.token_ids) for c in output.outputs)
                for completion in output.outputs:
                    logprobs = None
                    if request.logprobs and completion.logprobs_delta:
                        logprobs = chat_logprobs(
                            completion.logprobs_delta, names, num_top
                        )
                    finishing = (
                        completion.finish_reason is not None and not finish_sent[completion.index]
                    )
                    new_ids = list(completion.token_ids_delta) if return_ids else None
                    if (not completion.text_delta and logprobs is None and not finishing
                            and not new_ids):
                        continue
                    finish_sent[completion.index] = finish_sent[completion.index] or finishing
                    if shaped is not None:
                        shaped_choice = self._shaped_choice(
                            shaped[completion.index], completion, logprobs, finishing, new_ids
                        )
                        if shaped_choice is not None:
                            choices.append(shaped_choice)
                        continue
                    finish_reason = completion.finish_reason if finishing else None
                    stop_reason = completion.stop_reason if finishing else None
                    if logprobs is None:
                        choices.append(
                            chat_choice(
                                completion.index,
                                {"content": completion.text_delta},
                                finish_reason,
                                stop_reason,
                                new_ids,
                            )
                        )
                        continue
                    choices.append(
                        ChatStreamChoice(
                            index=completion.index,
                            delta=ChatDelta(content=completion.text_delta),
                            logprobs=logprobs,
                            finish_reason=finish_reason,
                            stop_reason=stop_reason,
                            token_ids=new_ids,
                        )
                    )
                if choices:
                    yield chunk(choices)
                if output.finished:
                    final = output
            if include_usage and final is not None:
                yield chunks.event([], self.usage([num_prompt_tokens], [final]).model_dump())
            yield SSE_DONE
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - the status is sent; report in the stream
            yield self.generation_error(error).to_sse()
            yield SSE_DONE
        finally:
            stream.close()

    @staticmethod
    def _shaped_choice(
        choice_stream: ChoiceStream, completion, logprobs, finishing: bool,
        token_ids: list[int] | None,
    ) -> ChatStreamChoice | None:
        """This step's entry of one choice under reasoning / tool rules: one delta (reasoning,
        content and tool-call fragments merged), so a chunk never holds an index twice. The
        step's ids go out even while the text is held (return_token_ids)."""
        delta = choice_stream.feed(completion.text_delta, final=finishing)
        if delta is None:
            if not finishing and logprobs is None and not token_ids:
                return None
            delta = ChatDelta()
        choice = ChatStreamChoice(
            index=completion.index, delta=delta, logprobs=logprobs, token_ids=token_ids
        )
        if finishing:
            choice.finish_reason = choice_stream.finish_reason(completion.finish_reason)
            choice.stop_reason = completion.stop_reason
        return choice
