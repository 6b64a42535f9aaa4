"""Tool calling for chat: what `tools` / `tool_choice` ask for, how the prompt carries the tools,
and how a reply becomes `tool_calls`.

- "none" (or no tools): plain text.
- "auto": the model chooses; its reply is parsed by the family's parser (tool_parsers/). A reply
  is either parsed calls or plain text, never a broken call.
- "required" / a named function: a grammar built from the tools' JSON schemas forces the reply
  (vLLM's approach): a JSON array of {"name", "parameters"} for "required" (one item when
  parallel_tool_calls is false), the function's arguments object for a named one. The arguments
  therefore always parse and match the schema.

Templates that render tools get them as `tools=`; for templates that know nothing of tools (the
default SmolLM2 template), the tools are described in a system message in the parser's format,
and earlier calls and results are written into the history the same way.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from ladle.entrypoints.openai.errors import BadRequestError
from ladle.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    ToolCall,
)
from ladle.entrypoints.openai.tool_parsers import ToolParser
from ladle.entrypoints.openai.tool_parsers.forced import (
    NamedArgumentsParser,
    RequiredCallsParser,
)
from ladle.structured.params import StructuredOutputsParams


@dataclass
class ToolPlan:
    """How one request handles tools."""

    mode: str  # "none" | "auto" | "required" | "named"
    parser: ToolParser | None = None
    tool_names: set[str] = field(default_factory=set)
    named_function: str | None = None
    structured_outputs: StructuredOutputsParams | None = None

    @property
    def is_forced(self) -> bool:
        return self.mode in ("required", "named")

    @property
    def is_active(self) -> bool:
        return self.mode != "none"

    @property
    def call_parser(self) -> ToolParser | None:
        """What reads this plan's calls out of the reply, whole or as it streams."""
        if self.mode == "auto":
            return self.parser
        if self.mode == "required":
            return RequiredCallsParser()
        if self.mode == "named":
            assert self.named_function is not None
            return NamedArgumentsParser(self.named_function)
        return None


def plan_tools(request: ChatCompletionRequest, parser: ToolParser) -> ToolPlan:
    """Check tools and tool_choice; raises BadRequestError naming the problem."""
    tools = request.tools or []
    choice = request.tool_choice
    names = [tool.function.name for tool in tools]
    for index, name in enumerate(names):
        if not name:
            raise BadRequestError("a tool's function needs a name", param=f"tools[{index}]")
    duplicates = {name for name in names if names.count(name) > 1}
    if duplicates:
        raise BadRequestError(
            f"tool names must be unique; repeated: {', '.join(sorted(duplicates))}", param="tools"
        )
    if not tools:
        if choice not in (None, "none"):
            raise BadRequestError("tool_choice needs tools", param="tool_choice")
        return ToolPlan(mode="none")
    schemas = {
        tool.function.name: _parameters_schema(tool.function.parameters, index)
        for index, tool in enumerate(tools)
    }
    if choice is None or choice == "auto":
        return ToolPlan(mode="auto", parser=parser, tool_names=set(names))
    if choice == "none":
        return ToolPlan(mode="none")
    if choice == "required":
        items = [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "parameters": schemas[name]},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for name in names
        ]
        schema: dict = {
            "type": "array",
            "minItems": 1,
            "items": items[0] if len(items) == 1 else {"anyOf": items},
        }
        if not request.parallel_tool_calls:
            schema["maxItems"] = 1
        return ToolPlan(
            mode="required", tool_names=set(names), structured_outputs=_grammar(schema, "tools")
        )
    assert not isinstance(choice, str)
    name = choice.function.name
    if name not in schemas:
        raise BadRequestError(
            f"tool_choice names function {name!r}, which is not among the tools "
            f"({', '.join(names)})",
            param="tool_choice",
        )
    return ToolPlan(
        mode="named",
        tool_names={name},
        named_function=name,
        structured_outputs=_grammar(schemas[name], f"tools[{names.index(name)}]"),
    )


def _parameters_schema(parameters: dict | None, index: int) -> dict:
    schema = parameters if parameters is not None else {"type": "object", "properties": {}}
    _grammar(schema, f"tools[{index}].function.parameters")  # a bad schema is a 400 now
    return schema


def _grammar(schema: dict, param: str) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(json=schema)
    except ValueError as error:
        raise BadRequestError(str(error), param=param) from error


# ----- prompt ------------------------------------------------------------------------------


def template_knows_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in chat_template and "tool_calls" in chat_template


def build_template_messages(
    request: ChatCompletionRequest, parser: ToolParser, template_has_tools: bool
) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) for the chat template."""
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools or []]
    describe_tools = bool(tools) and request.tool_choice != "none"
    messages = [
        _template_message(message, parser, template_has_tools) for message in request.messages
    ]
    if template_has_tools:
        return messages, (tools if describe_tools else None)
    if describe_tools:
        system = _tools_system_prompt(tools, parser)
        if messages and messages[0]["role"] in ("system", "developer"):
            messages[0] = {**messages[0], "content": messages[0]["content"] + "\n\n" + system}
        else:
            messages.insert(0, {"role": "system", "content": system})
    return messages, None


def _template_message(message: ChatMessage, parser: ToolParser, template_has_tools: bool) -> dict:
    entry: dict = {"role": message.role, "content": message.text()}
    if message.name is not None:
        entry["name"] = message.name
    if message.tool_call_id is not None:
        entry["tool_call_id"] = message.tool_call_id
    if not message.tool_calls and message.role != "tool":
        return entry
    if template_has_tools:
        if message.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _arguments_object(call.function.arguments),
                    },
                }
                for call in message.tool_calls
            ]
        return entry
    # A template without tools: write the calls and results in the parser's own format.
    if message.tool_calls:
        calls = "\n".join(
            parser.render_call(call.function.name, _arguments_object(call.function.arguments))
            for call in message.tool_calls
        )
        entry["content"] = (entry["content"] + "\n" if entry["content"] else "") + calls
        return entry
    return {"role": "user", "content": f"<tool_response>\n{entry['content']}\n</tool_response>"}


def _arguments_object(arguments: str) -> dict:
    try:
        value = json.loads(arguments)
    except ValueError:
        raise BadRequestError(
            f"a tool call's arguments are not JSON: {arguments[:80]!r}", param="messages"
        ) from None
    if not isinstance(value, dict):
        raise BadRequestError("a tool call's arguments must be a JSON object", param="messages")
    return value


def _tools_system_prompt(tools: list[dict], parser: ToolParser) -> str:
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    example = parser.render_call("function_name", {"argument": "value"})
    return (
        "You can call these tools (JSON signatures, one per line):\n<tools>\n"
        f"{lines}\n</tools>\n\n"
        "To call a tool, reply with the call and nothing after it, in this form:\n"
        f"{example}\nOtherwise, answer in plain text."
    )


# ----- reply -------------------------------------------------------------------------------


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def extract_tool_calls(plan: ToolPlan, text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, tool_calls) of a finished reply under the plan: calls only when every one is
    complete and valid (a forced reply cut off by max_tokens is returned as content)."""
    if plan.mode == "auto":
        assert plan.parser is not None
        content, calls = plan.parser.extract(text, plan.tool_names)
        return content, [_tool_call(call.name, call.arguments) for call in calls]
    parser = plan.call_parser
    if parser is None:
        return text, []
    calls = parser.parse_calls(text, plan.tool_names)
    if calls is None:
        return text, []
    return None, [_tool_call(call.name, call.arguments) for call in calls]


def _tool_call(name: str, arguments: str) -> ToolCall:
    return ToolCall(id=new_tool_call_id(), function=FunctionCall(name=name, arguments=arguments))
