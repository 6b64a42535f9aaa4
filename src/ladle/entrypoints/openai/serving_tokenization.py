"""POST /tokenize and POST /detokenize, with vLLM's request and response shapes.

    /tokenize    {"prompt": "text", "add_special_tokens": true}            (a completion prompt)
                 {"messages": [...], "add_generation_prompt": true, ...}   (a chat, as rendered
                                                                            by /v1/chat/completions)
                 -> {"count", "max_model_len", "tokens", "token_strs"}
    /detokenize  {"tokens": [ids]} -> {"prompt": "text"}

Clients count tokens with them before sending a prompt (does it fit max_model_len?) and
inspect the chat template's output. A chat is rendered by the chat handler itself, so the ids
are exactly the prompt /v1/chat/completions would run. Both need the tokenizer: under
--skip-tokenizer-init they are a 400 saying so.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from ladle.entrypoints.openai.errors import BadRequestError, from_validation_error
from ladle.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage, ChatTool, _Strict
from ladle.entrypoints.openai.serving_base import OpenAIServing
from ladle.entrypoints.openai.serving_chat import OpenAIServingChat
from ladle.entrypoints.openai.tool_calling import plan_tools
from ladle.frontend.client import AsyncEngineClient
from ladle.frontend.tokenizer_required import needs_tokenizer


class _Forbidding(_Strict):
    # A misspelt field here changes nothing a client could notice, so it is named, not dropped.
    model_config = ConfigDict(strict=True, extra="forbid")


class TokenizeCompletionRequest(_Forbidding):
    model: StrictStr | None = None
    prompt: StrictStr
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool = False


class TokenizeChatRequest(_Forbidding):
    model: StrictStr | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    # As chat completions: the template writes the special tokens.
    add_special_tokens: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    return_token_strs: StrictBool = False


class DetokenizeRequest(_Forbidding):
    model: StrictStr | None = None
    tokens: list[StrictInt]


class OpenAIServingTokenization(OpenAIServing):
    """The two routes; a chat prompt is rendered by `chat` (the chat completions handler)."""

    def __init__(
        self, client: AsyncEngineClient, served_model_name: str, chat: OpenAIServingChat
    ) -> None:
        super().__init__(client, served_model_name)
        self.chat = chat

    def tokenize(self, body: bytes) -> dict:
        """The body's prompt (or chat) as token ids, their count and the server's
        max_model_len (with token_strs, the tokens' vocabulary strings)."""
        raw = _json_object(body)
        request_class = TokenizeChatRequest if "messages" in raw else TokenizeCompletionRequest
        request = self._parse(request_class, body)
        tokenizer = self._tokenizer("/tokenize")
        if isinstance(request, TokenizeChatRequest):
            token_ids = self._render_chat(request)
        else:
            token_ids = tokenizer.encode(
                request.prompt, add_special_tokens=request.add_special_tokens
            )
        token_strs = (
            tokenizer.hf_tokenizer.convert_ids_to_tokens(token_ids)
            if request.return_token_strs else None
        )
        return {
            "count": len(token_ids),
            "max_model_len": self.client.info.max_model_len,
            "tokens": token_ids,
            "token_strs": token_strs,
        }

    def detokenize(self, body: bytes) -> dict:
        """The text of the body's token ids (special tokens kept, as vLLM decodes them)."""
        _json_object(body)
        request = self._parse(DetokenizeRequest, body)
        tokenizer = self._tokenizer("/detokenize")
        vocab_size = self.client.info.vocab_size
        for index, token_id in enumerate(request.tokens):
            if not 0 <= token_id < vocab_size:
                raise BadRequestError(
                    f"token id {token_id} is outside the vocabulary [0, {vocab_size})",
                    param=f"tokens.{index}",
                )
        return {"prompt": tokenizer.decode(request.tokens, skip_special_tokens=False)}

    def _parse(self, request_class, body: bytes):
        try:
            request = request_class.model_validate_json(body)
        except ValidationError as error:
            raise from_validation_error(error) from error
        self.check_model(request.model)
        return request

    def _tokenizer(self, route: str):
        tokenizer = self.client.tokenizer
        if tokenizer is None:
            raise BadRequestError(needs_tokenizer(route, self.client.no_tokenizer_reason))
        return tokenizer

    def _render_chat(self, request: TokenizeChatRequest) -> list[int]:
        chat_request = ChatCompletionRequest.model_validate_json(
            request.model_dump_json(exclude={"return_token_strs"}, exclude_none=True)
        )
        plan = plan_tools(chat_request, self.chat.tool_parser)
        _, token_ids = self.chat.render(chat_request, plan)
        return token_ids


def _json_object(body: bytes) -> dict:
    try:
        raw = json.loads(body)
    except ValueError as error:
        raise BadRequestError(f"the request body is not valid JSON: {error}") from error
    if not isinstance(raw, dict):
        raise BadRequestError("the request body must be a JSON object")
    return raw
