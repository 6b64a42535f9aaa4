"""Property-based fuzzing of both generation routes from their JSON schema (the request models'
own schema, which is what the OpenAPI document would publish): bodies that follow the schema,
bodies that break it, and raw bytes. Whatever arrives, the answer is never a 5xx and the server
stays healthy. A fixed example budget and a derandomized run keep it bounded and repeatable."""

from __future__ import annotations

import json

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from ladle.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

EXAMPLES_PER_ROUTE = 120
# Fields whose valid values cost generation time; fuzzed bodies keep them cheap (their ranges
# are tested in tests/test_sampling_limits.py and the bad-input tests).
COSTLY_FIELDS = ("n", "best_of", "max_tokens", "max_completion_tokens", "min_tokens")
ROUTES = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}


def cheap(body: object) -> object:
    if isinstance(body, dict):
        for field in COSTLY_FIELDS:
            value = body.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and 1 < value < 2**31:
                body[field] = 1 + value % 3
        if isinstance(body.get("prompt"), list) and len(body["prompt"]) > 4:
            body["prompt"] = body["prompt"][:4]  # each prompt is a request of its own
    return body


def bodies(model) -> st.SearchStrategy[bytes]:
    schema = model.model_json_schema()
    valid_shape = from_schema(schema).map(cheap).map(lambda b: json.dumps(b).encode())
    any_json = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda children: st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from([*schema["properties"], "x"]), children, max_size=6),
        max_leaves=20,
    ).map(lambda b: json.dumps(cheap(b)).encode())
    return st.one_of(valid_shape, valid_shape, any_json, st.binary(max_size=200))


def fuzz_route(server, path: str) -> None:
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=server.base_url, timeout=120) as http:

        @settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, derandomize=True,
                  database=None, suppress_health_check=list(HealthCheck))
        @given(body=bodies(ROUTES[path]))
        def check(body: bytes) -> None:
            response = http.post(path, content=body,
                                 headers={"Content-Type": "application/json"})
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code < 500, (body, response.text)

        check()
        assert http.get("/health").status_code == 200
    print(f"\n{path}: {statuses}")
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0  # both kinds were reached


def test_fuzz_completions(default_server):
    fuzz_route(default_server, "/v1/completions")


def test_fuzz_chat_completions(default_server):
    fuzz_route(default_server, "/v1/chat/completions")
