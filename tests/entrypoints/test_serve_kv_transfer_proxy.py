"""Two `ladle serve --kv-transfer-config '{"kv_role": "kv_both"}'` servers behind a tiny proxy
speaking vLLM's disaggregated-serving protocol (kv_transfer_params): the prefill server answers
one token and the params, the decode server pulls the KV and decodes. The tokens equal one
engine's; the pull, the handoff and the release show in /metrics; neither side leaks a block;
malformed params are 400s naming the field, stale ones fall back to computing the prompt."""

from __future__ import annotations

import glob
import json
import time

import httpx
import pytest

from ladle import SamplingParams
from tests.entrypoints.conftest import API_KEY, SERVED_NAME, TINY_ENGINE_ARGS
from tests.entrypoints.server_process import ServerProcess, engine_is_idle, read_metrics, wait_until

PROMPTS = ["The quick brown fox jumps over the lazy dog, again and again and",
           "Hello, world! Hello, world! Hello,"]
MAX_TOKENS = 10
HOLD_TIMEOUT_S = 6.0
# What vLLM's example proxies send the prefill instance.
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False,
                  "remote_engine_id": None, "remote_block_ids": None, "remote_host": None,
                  "remote_port": None}
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def _server(tiny_model_path) -> ServerProcess:
    config = {"kv_role": "kv_both",
              "kv_connector_extra_config": {"hold_timeout_s": HOLD_TIMEOUT_S}}
    return ServerProcess(
        [tiny_model_path("llama"), "--served-model-name", SERVED_NAME, *TINY_ENGINE_ARGS,
         "--kv-transfer-config", json.dumps(config)],
        api_key=API_KEY,
    )


@pytest.fixture(scope="module")
def pair(tiny_model_path):
    prefill, decode = _server(tiny_model_path), _server(tiny_model_path)
    prefill.start()
    try:
        decode.start()
    except BaseException:
        prefill.stop()
        raise
    yield prefill, decode
    pids = [server.engine_pid for server in (prefill, decode)]
    decode.stop()
    prefill.stop()
    # Each engine exported its KV pool (a /dev/shm file on the CPU); none outlives the server.
    left = [path for pid in pids for path in glob.glob(f"/dev/shm/ladle-kv-{pid}-*")]
    assert pids[0] and not left


def _post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/{path}", json=body, headers=HEADERS, timeout=60)


def prefill_params(prefill: ServerProcess, path: str, body: dict) -> dict:
    """The proxy's first leg, as vLLM's toy proxy makes it (one token, not streamed)."""
    first = dict(body, max_tokens=1, stream=False, kv_transfer_params=PREFILL_PARAMS)
    first.pop("max_completion_tokens", None)
    response = _post(prefill, path, first)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["choices"][0]["finish_reason"] == "length"
    return answer["kv_transfer_params"]


def proxied(pair, path: str, body: dict) -> dict:
    prefill, decode = pair
    params = prefill_params(prefill, path, body)
    response = _post(decode, path, dict(body, kv_transfer_params=params))
    assert response.status_code == 200, response.text
    return response.json()


def offline_texts(offline_llm, prompts, max_tokens=MAX_TOKENS) -> list[str]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outputs = offline_llm.generate(prompts, params, use_tqdm=False)
    return [output.outputs[0].text for output in outputs]


def both_idle(pair) -> bool:
    return all(engine_is_idle(server) for server in pair) and (
        read_metrics(pair[0])["ladle:kv_handoffs_held"] == 0
    )


def test_completions_through_the_proxy_equal_one_engine(pair, offline_llm):
    prefill, decode = pair
    pulls_before = read_metrics(decode)["ladle:kv_pulls_total"]
    expected = offline_texts(offline_llm, PROMPTS)
    for prompt, text in zip(PROMPTS, expected, strict=True):
        body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS,
                "temperature": 0, "ignore_eos": True}
        params = prefill_params(prefill, "completions", body)
        for field in ("remote_engine_id", "remote_block_ids", "remote_host", "remote_port"):
            assert params[field] is not None, field
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        answer = _post(decode, "completions", dict(body, kv_transfer_params=params)).json()
        assert answer["choices"][0]["text"] == text
        assert answer["usage"]["completion_tokens"] == MAX_TOKENS
        assert answer["kv_transfer_params"] is None
    decode_metrics = read_metrics(decode)
    assert decode_metrics["ladle:kv_pulls_total"] == pulls_before + len(PROMPTS)
    assert decode_metrics["ladle:kv_pull_blocks_total"] > 0
    assert decode_metrics["ladle:kv_pull_bytes_total"] > 0
    assert decode_metrics["ladle:kv_pull_seconds_total"] > 0
    assert read_metrics(prefill)["ladle:kv_handoffs_total"] >= len(PROMPTS)
    # The decode server released each hold at once (not at the timeout).
    assert wait_until(lambda: both_idle(pair), HOLD_TIMEOUT_S / 2)
    assert read_metrics(prefill)["ladle:kv_handoffs_expired_total"] == 0


def test_streamed_chat_through_the_proxy(pair, offline_llm):
    prefill, decode = pair
    messages = [{"role": "user", "content": PROMPTS[0]}]
    expected = offline_llm.chat([messages], SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
                                use_tqdm=False)[0].outputs[0].text
    body = {"model": SERVED_NAME, "messages": messages, "max_tokens": MAX_TOKENS,
            "temperature": 0}
    params = prefill_params(prefill, "chat/completions", body)
    text = ""
    with httpx.stream("POST", f"{decode.base_url}/v1/chat/completions", headers=HEADERS,
                      json=dict(body, stream=True, kv_transfer_params=params),
                      timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
    assert text == expected
    assert wait_until(lambda: both_idle(pair), HOLD_TIMEOUT_S / 2)


def test_bad_params_are_400s_naming_the_field(pair):
    prefill, decode = pair
    body = {"model": SERVED_NAME, "prompt": PROMPTS[1], "max_tokens": 4, "temperature": 0}
    params = prefill_params(prefill, "completions", body)
    for field, value in (("first_token_ids", None), ("remote_block_ids", "3"),
                         ("remote_kv", None), ("first_token_ids", [10**9])):
        bad = dict(params, **{field: value})
        response = _post(decode, "completions", dict(body, kv_transfer_params=bad))
        assert response.status_code == 400, (field, response.text)
        assert field in response.json()["error"]["message"]
    # The engine's own checks name the field too (a block table one block short).
    short = dict(params, remote_block_ids=params["remote_block_ids"][:-1])
    response = _post(decode, "completions", dict(body, kv_transfer_params=short))
    assert response.status_code == 400 and "remote_block_ids" in response.text
    response = _post(prefill, "completions",
                     dict(body, stream=True, kv_transfer_params=PREFILL_PARAMS))
    assert response.status_code == 400 and response.json()["error"]["param"] == "stream"
    response = _post(prefill, "completions", dict(body, n=2, kv_transfer_params=PREFILL_PARAMS))
    assert response.status_code == 400 and response.json()["error"]["param"] == "n"
    # The unused hold is released by the decode server's valid request.
    answer = _post(decode, "completions", dict(body, kv_transfer_params=params))
    assert answer.status_code == 200
    assert wait_until(lambda: both_idle(pair), HOLD_TIMEOUT_S / 2)


def test_stale_params_fall_back_to_computing_the_prompt(pair, offline_llm):
    prefill, decode = pair
    [expected] = offline_texts(offline_llm, [PROMPTS[1]])
    body = {"model": SERVED_NAME, "prompt": PROMPTS[1], "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True}
    params = proxied_params = prefill_params(prefill, "completions", body)
    assert _post(decode, "completions", dict(body, kv_transfer_params=params)).json()[
        "choices"][0]["text"] == expected
    before = read_metrics(decode)
    # Used twice: the second would read blocks already given back, so it computes.
    again = _post(decode, "completions", dict(body, kv_transfer_params=proxied_params))
    assert again.json()["choices"][0]["text"] == expected
    # A pool that is not there: the pull fails and the prompt is computed.
    gone = dict(prefill_params(prefill, "completions", body), remote_kv='{"path": "/nonexistent"}')
    assert _post(decode, "completions", dict(body, kv_transfer_params=gone)).json()[
        "choices"][0]["text"] == expected
    after = read_metrics(decode)
    assert after["ladle:kv_pulls_total"] == before["ladle:kv_pulls_total"]
    assert after["ladle:kv_pulls_failed_total"] == before["ladle:kv_pulls_failed_total"] + 1
    # A hold nobody pulls expires on the prefill server; its params then compute too.
    expired_before = read_metrics(prefill)["ladle:kv_handoffs_expired_total"]
    late = prefill_params(prefill, "completions", body)
    time.sleep(HOLD_TIMEOUT_S + 0.5)
    assert wait_until(
        lambda: read_metrics(prefill)["ladle:kv_handoffs_expired_total"] == expired_before + 1, 5
    )
    assert _post(decode, "completions", dict(body, kv_transfer_params=late)).json()[
        "choices"][0]["text"] == expected
    assert read_metrics(decode)["ladle:kv_pulls_too_late_total"] >= 1
    assert wait_until(lambda: both_idle(pair), HOLD_TIMEOUT_S / 2)


def test_one_token_decode_computes_and_releases(pair, offline_llm):
    """max_tokens 1: the prefill's token is the whole answer; the decode server runs the
    request itself (nothing to decode after a pull) and releases the hold at once."""
    prefill, decode = pair
    [expected] = offline_texts(offline_llm, [PROMPTS[0]], max_tokens=1)
    body = {"model": SERVED_NAME, "prompt": PROMPTS[0], "max_tokens": 1, "temperature": 0}
    answer = proxied(pair, "completions", body)
    assert answer["choices"][0]["text"] == expected
    assert answer["usage"]["completion_tokens"] == 1
    assert wait_until(lambda: both_idle(pair), HOLD_TIMEOUT_S / 2)


def test_first_token_stop_string_returns_no_params(pair, offline_llm):
    """A stop string in the first token ends the prefill request there: no params (its hold
    is freed with it), so the proxy's decode leg is a plain request."""
    prefill, _ = pair
    [first] = offline_texts(offline_llm, [PROMPTS[1]], max_tokens=1)
    body = {"model": SERVED_NAME, "prompt": PROMPTS[1], "max_tokens": 1, "temperature": 0,
            "stop": [first.strip() or first], "kv_transfer_params": PREFILL_PARAMS}
    answer = _post(prefill, "completions", body).json()
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["kv_transfer_params"] is None
    assert wait_until(lambda: both_idle(pair), HOLD_TIMEOUT_S / 2)


def test_release_needs_the_handoffs_token(pair):
    prefill, decode = pair
    body = {"model": SERVED_NAME, "prompt": PROMPTS[1], "max_tokens": 4, "temperature": 0}
    params = prefill_params(prefill, "completions", body)
    url = f"{prefill.base_url}/v1/kv_transfer/release"
    ids = [params["remote_request_id"]]
    assert httpx.post(url, json={"request_ids": ids}).status_code == 400
    wrong = httpx.post(url, json={"request_ids": ids, "release_token": "0" * 32})
    assert wrong.json() == {"released": 0}
    assert read_metrics(prefill)["ladle:kv_handoffs_held"] == 1
    right = httpx.post(url, json={"request_ids": ids, "release_token": params["release_token"]})
    assert right.json() == {"released": 1}  # no API key: the token is the credential
    assert wait_until(lambda: both_idle(pair), HOLD_TIMEOUT_S / 2)


def test_decode_client_disconnect_frees_both_sides(pair):
    prefill, decode = pair
    body = {"model": SERVED_NAME, "prompt": PROMPTS[0] * 2, "max_tokens": 300,
            "temperature": 0, "ignore_eos": True}
    params = prefill_params(prefill, "completions", body)
    with httpx.stream("POST", f"{decode.base_url}/v1/completions", headers=HEADERS,
                      json=dict(body, stream=True, kv_transfer_params=params),
                      timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # the client leaves after its first chunk
    assert wait_until(lambda: both_idle(pair), HOLD_TIMEOUT_S / 2)
