"""The README's main job: `ladle serve` with no model serves the default SmolLM2 and answers a
chat request through the official client."""

from __future__ import annotations

import openai
import pytest

from tests.entrypoints.server_process import ServerProcess


@pytest.mark.slow  # its own server on the default model, ~50 s
def test_serve_default_model_answers_chat():
    # A fresh machine fetches the model (~93 MB) first, hence the generous start-up bound.
    server = ServerProcess(["--max-num-seqs", "8"]).start(timeout_s=900)
    try:
        assert "memory budget" in server.log()
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused",
                               max_retries=0, timeout=120)
        [model] = client.models.list().data
        assert model.id == "SmolLM2-135M-Instruct"
        response = client.chat.completions.create(
            model=model.id,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=64,
            temperature=0,
        )
        choice = response.choices[0]
        assert "Paris" in choice.message.content
        assert choice.finish_reason == "stop"
        assert response.usage.completion_tokens < 64
    finally:
        server.stop()
