"""A vLLM-style `serve` command line, pasted unchanged but for the program name: a Hub id (from
a hub-layout cache, offline), vLLM's flag spellings, a size suffix and a --config file."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.entrypoints.server_process import ServerProcess
from tests.model.test_hub import REPO_ID, build_hub_cache


def test_vllm_serve_command_line(tiny_model_path, tmp_path, monkeypatch) -> None:
    hub = tmp_path / "hub"
    build_hub_cache(hub, tiny_model_path("llama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = tmp_path / "serve.yaml"
    config.write_text("max-num-seqs: 8\nenable-chunked-prefill: true\n")
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    # vllm serve tiny-org/tiny-llama --max-model-len 0.5K --no-enable-prefix-caching ...
    args = [
        REPO_ID,
        "--max-model-len", "0.5K",
        "--no-enable-prefix-caching",
        "--num-gpu-blocks-override", "64",
        "--uvicorn-log-level", "warning",
        "--generation-config", "vllm",
        "--dtype", "float32",
        "--max-logprobs", "4",
        "--disable-log-stats",
        "--chat-template", str(template),
        "--served-model-name", REPO_ID, "my-alias",  # vLLM: several names, all served
        "--trust-remote-code",
        "--enable-auto-tool-choice",
        "--tokenizer-mode", "auto",
        "--config", str(config),
        "--allowed-origins", '["https://app.example"]',
        "--root-path", "/api",
        "--enable-log-requests",
    ]  # fmt: skip
    with ServerProcess(args) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
        models = client.models.list().data
        assert [model.id for model in models] == [REPO_ID, "my-alias"]
        assert client.models.retrieve("my-alias").id == "my-alias"
        by_alias = client.completions.create(model="my-alias", prompt="hi", max_tokens=1)
        assert by_alias.model == REPO_ID  # responses name the first
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="other", prompt="hi", max_tokens=1)
        assert models[0].max_model_len == 512
        completion = client.completions.create(
            model=REPO_ID, prompt="hello world", max_tokens=3, temperature=0
        )
        assert completion.usage.completion_tokens == 3
        chat = client.chat.completions.create(
            model=REPO_ID, messages=[{"role": "user", "content": "hello world"}], max_tokens=2,
            extra_body={"add_generation_prompt": False},
        )
        # rendered by the --chat-template file, so as long as that text sent as a prompt
        rendered = client.completions.create(
            model=REPO_ID, prompt="[user] hello world\n", max_tokens=1,
            extra_body={"add_special_tokens": False},
        )
        assert chat.usage.prompt_tokens == rendered.usage.prompt_tokens
        with pytest.raises(openai.BadRequestError, match="max-logprobs"):
            client.completions.create(model=REPO_ID, prompt="hi", max_tokens=1, logprobs=5)
        check_vllm_routes_and_http_flags(server, tiny_model_path)


def check_vllm_routes_and_http_flags(server: ServerProcess, tiny_model_path) -> None:
    """/ping (GET and POST), /v1/models' vLLM fields, CORS from --allowed-origins, --root-path."""
    for method in ("GET", "POST"):
        assert httpx.request(method, f"{server.base_url}/ping").status_code == 200
    card = httpx.get(f"{server.base_url}/v1/models").json()["data"][0]
    assert card["root"] == REPO_ID and card["parent"] is None
    assert card["permission"][0]["object"] == "model_permission"
    preflight = httpx.options(
        f"{server.base_url}/v1/completions",
        headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    other = httpx.get(f"{server.base_url}/v1/models", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    # --root-path: the proxy in front strips the prefix, so the routes stay where they were.
    assert httpx.get(f"{server.base_url}/v1/models").status_code == 200
