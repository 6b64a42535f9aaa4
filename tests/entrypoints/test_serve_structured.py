"""Structured output and tool calling through the official `openai` client against one real
`ladle serve` of the default model on the CPU (issue 10). Greedy, short max_tokens, concurrent
requests so the batch does the work: the whole module shares one server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from tests.entrypoints.server_process import ServerProcess
from tests.structured.schemas import SCHEMAS

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                           "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
SCHEMA_OF = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


@pytest.fixture(scope="module")
def server():
    process = ServerProcess([]).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=240
    )


def _chat(client: openai.OpenAI, **kwargs):
    kwargs.setdefault("max_tokens", 64)
    return client.chat.completions.create(model=MODEL, temperature=0, **kwargs)


def test_twenty_json_schemas_validate(client):
    def ask(item):
        description, schema = item
        response = _chat(
            client,
            messages=[{"role": "user", "content": f"Give me {description} as JSON."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "answer", "schema": schema, "strict": True}},
            max_tokens=96,
        )
        return response.choices[0]

    with ThreadPoolExecutor(len(SCHEMAS)) as pool:
        choices = list(pool.map(ask, SCHEMAS))
    for (description, schema), choice in zip(SCHEMAS, choices):
        assert choice.finish_reason == "stop", (description, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_on_completions_and_regex_choice_extras(client):
    def completion(extra, prompt, max_tokens=48):
        return client.completions.create(
            model=MODEL, prompt=prompt, temperature=0, max_tokens=max_tokens, n=2, seed=3,
            extra_body=extra,
        )

    with ThreadPoolExecutor(4) as pool:
        regex = pool.submit(completion, {"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2,4}"},
                                         "temperature": 1.0}, "A code:")
        choice = pool.submit(completion, {"structured_outputs": {"choice": ["Paris", "London"]}},
                             "The capital of France is")
        chat_choice = pool.submit(
            _chat, client, messages=[{"role": "user", "content": "Capital of Italy?"}],
            extra_body={"structured_outputs": {"choice": ["Rome", "Milan", "Turin"]}},
        )
        grammar = pool.submit(
            completion,
            {"structured_outputs": {"grammar": 'root ::= "The answer is " [0-9] [0-9]? "."'}},
            "Two plus two:",
        )
    for sample in regex.result().choices:
        assert re.fullmatch("[0-9]{3}-[a-z]{2,4}", sample.text), sample.text
    assert {sample.text for sample in choice.result().choices} <= {"Paris", "London"}
    assert chat_choice.result().choices[0].message.content in {"Rome", "Milan", "Turin"}
    for sample in grammar.result().choices:
        assert re.fullmatch(r"The answer is [0-9][0-9]?\.", sample.text), sample.text


def test_json_object_response_format(client):
    response = client.completions.create(
        model=MODEL, prompt='{"name": "Ada", "age": 36} is an example. Another one:',
        temperature=0, max_tokens=48, extra_body={"response_format": {"type": "json_object"}},
    )
    choice = response.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.text), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert choice.text.startswith("{"), choice.text


def _check_calls(tool_calls, names):
    assert tool_calls
    for call in tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA_OF[call.function.name])


def test_required_and_named_tool_calls_validate(client):
    with ThreadPoolExecutor(2) as pool:
        required = pool.submit(_chat, client, messages=WEATHER_QUESTION, tools=TOOLS,
                               tool_choice="required", parallel_tool_calls=False)
        named = pool.submit(_chat, client, messages=WEATHER_QUESTION, tools=TOOLS,
                            tool_choice={"type": "function", "function": {"name": "add"}})
    # "required" ends with "tool_calls", a named function with "stop" (OpenAI's and vLLM's).
    for response, names, finish in ((required.result(), {"get_weather", "add"}, "tool_calls"),
                                    (named.result(), {"add"}, "stop")):
        choice = response.choices[0]
        assert choice.finish_reason == finish
        assert choice.message.content is None
        _check_calls(choice.message.tool_calls, names)
    assert len(required.result().choices[0].message.tool_calls) == 1


def _reassemble(stream):
    calls: dict[int, dict] = {}
    content, finish = "", None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = entry["id"] or delta.id
                if delta.function is not None:
                    entry["name"] += delta.function.name or ""
                    entry["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [calls[index] for index in sorted(calls)], finish


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}, "auto"],
)
def test_streaming_tool_calls_reassemble_to_non_streaming(client, tool_choice):
    kwargs = dict(messages=WEATHER_QUESTION, tools=TOOLS, tool_choice=tool_choice,
                  parallel_tool_calls=False, max_tokens=40)
    whole = _chat(client, **kwargs).choices[0]
    content, calls, finish = _reassemble(_chat(client, stream=True, **kwargs))
    assert finish == whole.finish_reason
    expected = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
    assert [(c["name"], c["arguments"]) for c in calls] == expected
    assert all(c["id"].startswith("call_") for c in calls)
    if not calls:  # auto chose to answer: the same text, never half a call
        assert content == whole.message.content
        assert "<tool_call>" not in content


def test_auto_gives_a_parsed_call_or_plain_text(client):
    questions = ["What is 12 plus 30?", "Use get_weather for Rome in fahrenheit."]
    with ThreadPoolExecutor(len(questions)) as pool:
        responses = list(pool.map(
            lambda q: _chat(client, messages=[{"role": "user", "content": q}], tools=TOOLS,
                            max_tokens=40),
            questions,
        ))
    for response in responses:
        message = response.choices[0].message
        if message.tool_calls:
            assert response.choices[0].finish_reason == "tool_calls"
            for call in message.tool_calls:
                assert call.function.name in SCHEMA_OF
                assert isinstance(json.loads(call.function.arguments), dict)
        else:
            assert "<tool_call>" not in (message.content or "")


def test_tool_history_goes_through_the_template(client):
    messages = WEATHER_QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather",
                         "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees, sunny"},
    ]
    response = _chat(client, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=24)
    assert response.choices[0].message.tool_calls in (None, [])
    assert response.choices[0].message.content


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
         "objekt"),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}, "uniqueItems"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
        ({"structured_outputs": {"regex": "a(b"}}, "regex"),
        ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, "grammar"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one"),
        ({"structured_outputs": {"jsonn": {}}}, "jsonn"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "name"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "nope"),
        ({"tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "int"}}}}}],
          "tool_choice": "required"}, "int"),
        ({"tool_choice": "required"}, "tools"),
    ],
)
def test_bad_structured_input_is_a_400_naming_the_problem(client, body, words):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=WEATHER_QUESTION, max_tokens=4,
                                       extra_body=body)
    assert words in str(raised.value)
    # and the server keeps serving
    assert _chat(client, messages=WEATHER_QUESTION, max_tokens=2).choices[0].message.content


def test_agent_framework_runs_a_two_tool_loop(server):
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(f"get_weather({city})")
        return f"It is 21 degrees and sunny in {city}."

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append(f"add({a}, {b})")
        return a + b

    model = agents.OpenAIChatCompletionsModel(
        model=MODEL,
        openai_client=AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused"),
    )
    agent = agents.Agent(
        name="assistant",
        instructions="Answer with the help of the tools.",
        tools=[get_weather, add],
        model=model,
        # The first turn must call a tool; the SDK then resets tool_choice so the model answers.
        model_settings=agents.ModelSettings(tool_choice="required", temperature=0,
                                            max_tokens=48, parallel_tool_calls=False),
    )
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    assert calls, "the agent never called a tool"
    assert isinstance(result.final_output, str) and result.final_output
    kinds = [item.type for item in result.new_items]
    assert "tool_call_item" in kinds and "tool_call_output_item" in kinds
    assert kinds[-1] == "message_output_item"


def test_bench_serve_tool_calling_workload_against_ladle(server, tmp_path):
    """`ladle bench serve`'s tool-calling class is served, not skipped, and completes (one
    request, kept short for CI: seed 1 draws tool_choice="required", so the grammar runs)."""
    command = [
        sys.executable, "-m", "ladle.cli", "bench", "serve", "--base-url", server.base_url,
        "--workload", "tool-calling", "--num-prompts", "1",
        "--seed", "1", "--output-dir", str(tmp_path), "--no-plots", "--disable-tqdm",
    ]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert finished.returncode == 0, finished.stderr
    result = json.loads((tmp_path / "results.json").read_text())
    assert not result.get("skipped_workloads"), result.get("skipped_workloads")
    (run,) = result["runs"]
    assert run["summary"]["num_completed"] == 1 and run["summary"]["num_errors"] == 0
    assert {record["workload"] for record in run["records"]} == {"tool-calling"}
