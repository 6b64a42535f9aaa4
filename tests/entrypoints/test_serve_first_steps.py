"""What a new user of `ladle serve` trips on first, against the shared tiny server: retrieving
the model, the API docs behind the key, precise errors for image parts and top_logprobs, the
default max_tokens on an explicit null, and the one log line per finished request."""

from __future__ import annotations

import httpx
import openai
import pytest

from ladle.entrypoints.openai.request_log import RequestLogMiddleware
from ladle.entrypoints.openai.server import ServerSettings, build_app
from tests.entrypoints.conftest import SERVED_NAME
from tests.entrypoints.server_process import wait_until

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


@pytest.fixture(scope="module")
def client(tiny_server):
    with httpx.Client(
        base_url=tiny_server.base_url, headers=tiny_server.headers(), timeout=60
    ) as client:
        yield client


def test_openai_client_retrieves_the_served_model(openai_client):
    model = openai_client.models.retrieve(SERVED_NAME)
    assert model.id == SERVED_NAME
    assert model.object == "model"
    with pytest.raises(openai.NotFoundError) as raised:
        openai_client.models.retrieve("not-this-one")
    assert "not-this-one" in str(raised.value)


def test_openapi_and_docs_are_behind_the_api_key(tiny_server, client):
    for path in ("/openapi.json", "/docs"):
        assert httpx.get(f"{tiny_server.base_url}{path}", timeout=30).status_code == 401
    schema = client.get("/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models"} <= set(schema["paths"])
    # The generation routes document the bodies they validate, from the request models.
    body = schema["paths"][CHAT_PATH]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"] == "#/components/schemas/ChatCompletionRequest"
    assert "messages" in schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    docs = client.get("/docs")
    assert docs.status_code == 200
    assert "swagger-ui" in docs.text and "/openapi.json" in docs.text


def test_an_image_part_is_a_clear_400(client):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}]
    response = client.post(CHAT_PATH, json={"messages": messages, "max_tokens": 2})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "non-text content parts are not supported" in error["message"]
    assert error["param"] == "messages.0.content.1.type"
    # Text parts alone still work.
    text_only = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}]}]
    response = client.post(CHAT_PATH, json={"messages": text_only, "max_tokens": 2})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("top_logprobs", [21, -1])
def test_top_logprobs_out_of_range_names_top_logprobs(client, top_logprobs):
    response = client.post(
        CHAT_PATH,
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "logprobs": True,
            "top_logprobs": top_logprobs,
        },
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "top_logprobs"
    assert error["message"].startswith("top_logprobs") and "[0, 20]" in error["message"]


def test_null_max_tokens_on_completions_is_the_default_16(client):
    response = client.post(
        COMPLETIONS_PATH,
        json={
            "prompt": "Once upon a time",
            "max_tokens": None,
            "ignore_eos": True,
            "temperature": 0,
        },
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 16
    assert response.json()["choices"][0]["finish_reason"] == "length"


def test_one_log_line_per_finished_request(tiny_server, client):
    response = client.post(
        COMPLETIONS_PATH,
        json={"prompt": [11, 12, 13, 14, 15], "max_tokens": 7, "ignore_eos": True, "n": 2},
    )
    assert response.status_code == 200
    expected = "POST /v1/completions 200 in=5 out=14 "
    assert wait_until(lambda: expected in tiny_server.log(), timeout_s=10), tiny_server.log()
    # Streamed: logged once the stream ends, with its tokens.
    with client.stream(
        "POST",
        COMPLETIONS_PATH,
        json={
            "prompt": [11, 12, 13],
            "max_tokens": 5,
            "ignore_eos": True,
            "stream": True,
        },
    ) as stream:
        assert stream.status_code == 200
        stream.read()
    expected = "POST /v1/completions 200 in=3 out=5 "
    assert wait_until(lambda: expected in tiny_server.log(), timeout_s=10), tiny_server.log()
    # Errors are logged too; the polled probes are not.
    client.get("/v1/models/unknown")
    client.get("/health")
    assert wait_until(lambda: "GET /v1/models/unknown 404" in tiny_server.log(), timeout_s=10)
    assert "[ladle] GET /health" not in tiny_server.log()


def test_disable_log_requests_removes_the_middleware():
    def middleware_of(settings: ServerSettings) -> list:
        app = build_app(client=None, settings=settings)  # the client is only used at start-up
        return [m.cls for m in app.user_middleware]

    assert RequestLogMiddleware in middleware_of(ServerSettings("tiny"))
    assert RequestLogMiddleware not in middleware_of(ServerSettings("tiny", log_requests=False))
