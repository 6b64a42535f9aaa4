"""Property-based fuzzing of both generation routes from their JSON schema (the request models'
own schema, which is what the OpenAPI document would publish): bodies that follow the schema,
bodies that break it, and raw bytes. Whatever arrives, the answer is never a 5xx and the server
stays healthy. A fixed example budget and a derandomized run keep it bounded and repeatable."""

from __future__ import annotations

import json

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ladle.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

EXAMPLES_PER_ROUTE = 60
# Fields whose valid values cost generation time; fuzzed bodies keep them cheap (their ranges
# are tested in tests/test_sampling_limits.py and the bad-input tests).
COSTLY_FIELDS = ("n", "best_of", "max_tokens", "max_completion_tokens", "min_tokens")
ROUTES = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}


def cheap(body: object) -> object:
    if isinstance(body, dict):
        # Without a limit chat generates to the end of the context: give every body one.
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = 2
        for field in COSTLY_FIELDS:
            value = body.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and 1 < value < 2**31:
                body[field] = 1 + value % 3
        if isinstance(body.get("prompt"), list) and len(body["prompt"]) > 4:
            body["prompt"] = body["prompt"][:4]  # each prompt is a request of its own
    return body


EDGE_INTEGERS = [0, 1, -1, 2**31 - 1, 2**31, -(2**31) - 1, 2**63, 2**64, -(2**64), 10**30]
JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)


def from_json_schema(schema: dict, root: dict) -> st.SearchStrategy:
    """Values that follow a (pydantic-generated) JSON schema: $ref, anyOf, const, enum, and the
    JSON types, with integers and floats drawn to reach their edges (int32, int64, NaN, inf)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return st.deferred(lambda: from_json_schema(root["$defs"][name], root))
    if "anyOf" in schema:
        return st.one_of(*(from_json_schema(option, root) for option in schema["anyOf"]))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        return st.text(max_size=30)
    if kind == "integer":
        return st.integers(-5, 40) | st.integers() | st.sampled_from(EDGE_INTEGERS)
    if kind == "number":
        return st.floats() | st.floats(-3, 3)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        items = from_json_schema(schema.get("items", {}), root) if schema.get("items") else (
            JSON_SCALARS)
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=4)
    if kind == "object" and "properties" in schema:
        properties = {name: from_json_schema(sub, root)
                      for name, sub in schema["properties"].items()}
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {name: value for name, value in properties.items() if name in required},
            optional={name: value for name, value in properties.items() if name not in required},
        )
    if kind == "object":
        return st.dictionaries(st.text(max_size=8), JSON_SCALARS, max_size=3)
    return JSON_SCALARS


def bodies(model) -> st.SearchStrategy[bytes]:
    schema = model.model_json_schema()
    valid_shape = (from_json_schema(schema, schema).map(cheap)
                   .map(lambda b: json.dumps(b).encode()))
    any_json = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda children: st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from([*schema["properties"], "x"]), children, max_size=6),
        max_leaves=20,
    ).map(lambda b: json.dumps(cheap(b)).encode())
    # The required fields alone: a schema-following body with every optional field drawn at
    # random is nearly always refused somewhere (there are ~40), so without these a run of 60
    # may reach no 200 at all (it did once the completions schema grew a field).
    required = [name for name in schema.get("required", ()) if name in schema["properties"]]
    minimal = (st.fixed_dictionaries({name: from_json_schema(schema["properties"][name], schema)
                                      for name in required})
               .map(cheap).map(lambda b: json.dumps(b).encode()))
    return st.one_of(valid_shape, valid_shape, minimal, any_json, st.binary(max_size=200))


def fuzz_route(server, path: str) -> None:
    statuses: dict[int, int] = {}
    refusals: dict[str, int] = {}  # the distinct error messages, for a failure's report
    with httpx.Client(base_url=server.base_url, timeout=120) as http:

        @settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, derandomize=True,
                  database=None, suppress_health_check=list(HealthCheck))
        @given(body=bodies(ROUTES[path]))
        def check(body: bytes) -> None:
            response = http.post(path, content=body,
                                 headers={"Content-Type": "application/json"})
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code < 500, (body, response.text)
            if response.status_code >= 400:
                message = f"{response.status_code} {response.text[:160]}"
                refusals[message] = refusals.get(message, 0) + 1

        check()
        assert http.get("/health").status_code == 200
    print(f"\n{path}: {statuses}")
    # Both kinds were reached (on failure: the most frequent refusals, to say why).
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0, (
        statuses, sorted(refusals.items(), key=lambda item: -item[1])[:6]
    )


def test_fuzz_completions(default_server):
    fuzz_route(default_server, "/v1/completions")


def test_fuzz_chat_completions(default_server):
    fuzz_route(default_server, "/v1/chat/completions")
