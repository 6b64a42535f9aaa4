"""Pydantic models of the OpenAI request and response bodies that ladle serves.

Requests are parsed in strict mode straight from the JSON bytes (`parse_request`), so a wrong
type is a 400 rather than a silent coercion ("5" is not an integer, true is not 1) and bytes
that are not UTF-8 JSON are a 400 too. Numeric ranges come from the same table SamplingParams
checks (`ladle.sampling.limits.LIMITS`, through `api_field`), so an out-of-range value is a 400
naming the field before anything reaches the engine. The models drop fields they do not hold;
field_policy.py then refuses each such field with a 400 naming it (unknown ones unless the server
runs with --allow-unknown-fields), so no field is silently ignored.

Beyond OpenAI's fields, both requests take vLLM's sampling extras: top_k, min_p,
repetition_penalty, min_tokens, ignore_eos, stop_token_ids, skip_special_tokens,
include_stop_str_in_output, priority, allowed_token_ids, structured_outputs, return_token_ids,
return_tokens_as_token_ids;
and chat takes tools, tool_choice, parallel_tool_calls and chat_template_kwargs.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_serializer,
    model_validator,
)

from ladle.sampling.limits import api_field

# A JSON number: pydantic's strict float already takes JSON integers; this just says so.
Number = StrictFloat | StrictInt

ModelT = TypeVar("ModelT", bound=BaseModel)

# /v1/completions' max_tokens when a request gives none (or null), as OpenAI does.
DEFAULT_MAX_TOKENS = 16


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: StrictBool = False
    # vLLM's: with include_usage, every chunk carries the usage so far.
    continuous_usage_stats: StrictBool = False


class JsonSchemaFormat(_Strict):
    name: StrictStr = "response"
    description: StrictStr | None = None
    schema_: dict[str, Any] | StrictBool | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(BaseModel):
    """vLLM's `structured_outputs` extra; an unknown key is a 400, not a silent no-op."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)
    json_: dict[str, Any] | StrictStr | StrictBool | None = Field(default=None, alias="json")
    regex: StrictStr | None = None
    choice: list[StrictStr] | None = None
    grammar: StrictStr | None = None
    json_object: StrictBool | None = None


class _SamplingFields(_Strict):
    """Fields the two endpoints share."""

    model: StrictStr | None = None  # None: the served model (a convenience OpenAI lacks)
    n: api_field("n") = 1
    temperature: api_field("temperature") | None = None
    top_p: api_field("top_p") | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: api_field("presence_penalty") | None = None
    frequency_penalty: api_field("frequency_penalty") | None = None
    seed: api_field("seed") | None = None
    logit_bias: dict[str, Number] | None = None
    user: StrictStr | None = None
    # vLLM's extras
    top_k: api_field("top_k") | None = None
    min_p: api_field("min_p") | None = None
    repetition_penalty: api_field("repetition_penalty") | None = None
    min_tokens: api_field("min_tokens") = 0
    ignore_eos: StrictBool = False
    stop_token_ids: list[api_field("stop_token_ids")] | None = None
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    priority: api_field("priority") = 0
    allowed_token_ids: list[StrictInt] | None = None
    # Structured output (ladle.structured): OpenAI's response_format and vLLM's extra.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    # vLLM's prompt extras (prompt_options.py): keep the prompt's last k tokens (-1:
    # max_model_len); a salt that keeps this request's prefix-cache blocks apart from others'.
    truncate_prompt_tokens: StrictInt | None = None
    cache_salt: StrictStr | None = None
    bad_words: list[StrictStr] | None = None  # vLLM's: words never generated
    # vLLM's: the logprob of each prompt token (and its top k), not with stream
    prompt_logprobs: api_field("logprobs") | None = None
    # vLLM's disaggregated-serving proxy protocol (kv_transfer_fields.py).
    kv_transfer_params: dict[str, Any] | None = None
    # vLLM's: logprobs name tokens `token_id:N` (as --return-tokens-as-token-ids does).
    return_tokens_as_token_ids: StrictBool | None = None


class CompletionRequest(_SamplingFields):
    """POST /v1/completions. prompt: a string, a list of strings, a list of token ids or a list
    of token-id lists (one choice group per prompt)."""

    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: api_field("max_tokens") | None = DEFAULT_MAX_TOKENS  # null means the default too
    logprobs: api_field("logprobs") | None = None
    echo: StrictBool = False
    best_of: api_field("best_of") | None = None
    suffix: StrictStr | None = None
    add_special_tokens: StrictBool = True  # vLLM's: a bos (if the model has one) before text
    # vLLM's (>= 0.10.2): each choice carries prompt_token_ids and the generated token_ids
    # (streamed: the prompt's with a choice's first chunk, each chunk's new ids).
    return_token_ids: StrictBool = False


class ContentPart(_Strict):
    """A part of a message's content. Any type parses (so an image part gets a clear "not
    supported" rather than a schema error); only 'text' parts can be served."""

    type: StrictStr
    text: StrictStr | None = None

    @model_validator(mode="after")
    def _text_parts_have_text(self) -> ContentPart:
        if self.type == "text" and self.text is None:
            raise ValueError("a content part of type 'text' needs a 'text' field")
        return self


class FunctionCallIn(_Strict):
    name: StrictStr
    arguments: StrictStr


class ToolCallIn(_Strict):
    """An assistant turn's earlier tool call, as a client sends it back in the history."""

    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr | None = None
    tool_call_id: StrictStr | None = None
    tool_calls: list[ToolCallIn] | None = None
    reasoning_content: StrictStr | None = None

    def first_non_text_part(self) -> tuple[int, str] | None:
        """(index, type) of the first content part that is not text, if any."""
        if isinstance(self.content, list):
            for index, part in enumerate(self.content):
                if part.type != "text":
                    return index, part.type
        return None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class FunctionDefinition(_Strict):
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ChatTool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: StrictStr


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: api_field("max_tokens") | None = None
    max_completion_tokens: api_field("max_tokens") | None = None
    logprobs: StrictBool = False
    top_logprobs: api_field("logprobs") | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    # ladle / vLLM extras for the template
    add_generation_prompt: StrictBool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: the template already writes the special tokens, so none are added by default.
    add_special_tokens: StrictBool = False
    # vLLM's: end the prompt inside the last (assistant) message, which the reply continues.
    continue_final_message: StrictBool = False
    # vLLM's: the reply's content starts with the last message's, when that is the assistant's.
    echo: StrictBool = False
    # vLLM's (>= 0.10.2): the response carries the rendered template's prompt_token_ids and
    # each choice the generated token_ids (streamed: the prompt's on each choice's opening
    # chunk, each chunk's new ids on its choice).
    return_token_ids: StrictBool = False


def parse_request(model_class: type[ModelT], body: bytes) -> ModelT:
    """Validate raw JSON bytes; raises pydantic.ValidationError (json_invalid for bad JSON or
    bytes that are not UTF-8)."""
    return model_class.model_validate_json(body)


# ----- responses -------------------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


# vLLM's prompt_logprobs: per prompt token None (the first) or {token id: {logprob, rank,
# decoded_token}}, the prompt's own token first.
PromptLogprobs = list[dict[str, dict[str, Any]] | None]


class _TokenIdsWhenAsked(BaseModel):
    """A body with return_token_ids' fields: they are written only when set (a request with
    return_token_ids), so every other response keeps its bytes."""

    @model_serializer(mode="wrap")
    def _token_ids_when_asked(self, handler: Any) -> dict:
        fields = handler(self)
        for key in ("prompt_token_ids", "token_ids"):
            if key in fields and fields[key] is None:
                del fields[key]
        return fields


class CompletionChoice(_TokenIdsWhenAsked):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None
    # Only with return_token_ids.
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    kv_transfer_params: dict[str, Any] | None = None  # a prefill's answer to a proxy


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatResponseMessage(BaseModel):
    role: str = "assistant"  # --response-role, or the last message's (add_generation_prompt false)
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class _WithoutNones(BaseModel):
    @model_serializer(mode="wrap")
    def _without_nones(self, handler: Any) -> dict:
        return {key: value for key, value in handler(self).items() if value is not None}


class DeltaFunctionCall(_WithoutNones):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_WithoutNones):
    """A streamed piece of a tool call: the first carries id, type and name; later ones add
    argument text (OpenAI's shape)."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class ChatCompletionChoice(_TokenIdsWhenAsked):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # only with return_token_ids: the generated ids


class ChatCompletionResponse(_TokenIdsWhenAsked):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo | None = None
    kv_transfer_params: dict[str, Any] | None = None  # a prefill's answer to a proxy
    prompt_logprobs: PromptLogprobs | None = None
    # Only with return_token_ids: the rendered chat template's ids (vLLM puts them here, on
    # the response, where completions put them on each choice).
    prompt_token_ids: list[int] | None = None


class ChatDelta(BaseModel):
    """Only the fields a chunk changes are sent, as OpenAI does."""

    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="wrap")
    def _without_nones(self, handler: Any) -> dict:
        return {key: value for key, value in handler(self).items() if value is not None}


class ChatStreamChoice(_TokenIdsWhenAsked):
    index: int
    delta: ChatDelta
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # only with return_token_ids: this chunk's new ids


class ChatCompletionChunk(_TokenIdsWhenAsked):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids: on the opening chunks


class CompletionChunk(BaseModel):
    """Streamed /v1/completions pieces reuse the response shape, as OpenAI does."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ModelPermission(BaseModel):
    """vLLM's (and OpenAI's old) permission entry of a model card: clients that read it find
    what vLLM sends."""

    id: str = Field(default_factory=lambda: f"modelperm-{uuid.uuid4().hex}")
    object: Literal["model_permission"] = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(BaseModel):
    """One /v1/models entry with vLLM's fields (root: the model as the server was given it)."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "ladle"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
