"""A raw server-sent-events reader for streamed chat completions that checks the shape of every
chunk against OpenAI's streaming format, the way strict clients read it (`choices[0].delta`)."""

from __future__ import annotations

import json

import httpx

DELTA_FIELDS = {"role", "content", "reasoning_content", "tool_calls"}
CHUNK_FIELDS = {"id", "object", "created", "model", "choices", "usage"}


def read_chat_stream(base_url: str, body: dict, headers: dict | None = None) -> list[dict]:
    """POST a streamed chat request; the decoded chunks, each checked (check_chat_chunks)."""
    chunks = []
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json={**body, "stream": True},
                      headers=headers or {}, timeout=120) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = list(response.iter_lines())
    events = [line for line in lines if line]
    assert events[-1] == "data: [DONE]" and events.count("data: [DONE]") == 1
    for line in events[:-1]:
        assert line.startswith("data: "), line
        chunks.append(json.loads(line[len("data: "):]))
    check_chat_chunks(chunks, body)
    return chunks


def check_chat_chunks(chunks: list[dict], body: dict) -> None:
    """Every chunk: the same id, one entry per choice index, only delta fields; each choice
    opens with its role, ends with one finish_reason and sends nothing after it; usage only
    in a last chunk without choices when include_usage is asked for; return_token_ids' fields
    where vLLM puts them and nowhere else."""
    num_choices = body.get("n", 1)
    include_usage = (body.get("stream_options") or {}).get("include_usage", False)
    finished: set[int] = set()
    opened: set[int] = set()
    returns_ids = body.get("return_token_ids", False)
    for position, chunk in enumerate(chunks):
        opening = [c for c in chunk["choices"] if c["delta"].get("role")]
        # return_token_ids: the prompt's ids ride on each choice's opening chunk, only there
        id_fields = {"prompt_token_ids"} if returns_ids and opening else set()
        assert set(chunk) == CHUNK_FIELDS | id_fields, chunk
        for choice in chunk["choices"]:
            assert ("token_ids" in choice) == (returns_ids and not opening), choice
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["id"] == chunks[0]["id"] and chunk["created"] == chunks[0]["created"]
        indices = [choice["index"] for choice in chunk["choices"]]
        assert len(indices) == len(set(indices)), f"a choice index twice in one chunk: {chunk}"
        is_usage_chunk = include_usage and position == len(chunks) - 1
        if is_usage_chunk:
            assert chunk["choices"] == [] and chunk["usage"]["total_tokens"] > 0
        else:
            assert chunk["choices"], chunk
            assert chunk["usage"] is None or body.get("stream_options", {}).get(
                "continuous_usage_stats"
            )
        for choice in chunk["choices"]:
            index = choice["index"]
            assert 0 <= index < num_choices
            assert index not in finished, f"choice {index} sent after its finish_reason"
            delta = choice["delta"]
            assert set(delta) <= DELTA_FIELDS, delta
            if index not in opened:
                assert delta.get("role") == "assistant", f"choice {index} opens without a role"
                opened.add(index)
            else:
                assert "role" not in delta
            tool_indices = [call["index"] for call in delta.get("tool_calls") or []]
            assert len(tool_indices) == len(set(tool_indices)), delta
            if choice["finish_reason"] is not None:
                finished.add(index)
    assert finished == set(range(num_choices)), "every choice ends with a finish_reason"


def reassemble(chunks: list[dict], index: int = 0) -> dict:
    """One choice's message, put together as clients do: content and reasoning appended, tool
    calls by their index (id, type and name from the first fragment, arguments appended),
    return_token_ids' ids appended."""
    message = {"content": "", "reasoning_content": "", "tool_calls": {}, "finish_reason": None,
               "logprobs": [], "token_ids": []}
    for chunk in chunks:
        for choice in chunk["choices"]:
            if choice["index"] != index:
                continue
            delta = choice["delta"]
            message["content"] += delta.get("content") or ""
            message["reasoning_content"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                entry = message["tool_calls"].setdefault(call["index"], {"arguments": ""})
                if "id" in call:
                    assert "id" not in entry, "a call's id is sent once"
                    entry.update(id=call["id"], type=call["type"],
                                 name=call["function"]["name"])
                assert "id" in entry, "a call's first fragment carries its id and name"
                entry["arguments"] += call["function"].get("arguments") or ""
            message["logprobs"] += (choice.get("logprobs") or {}).get("content") or []
            message["token_ids"] += choice.get("token_ids") or []
            message["finish_reason"] = choice["finish_reason"] or message["finish_reason"]
    message["tool_calls"] = [message["tool_calls"][i] for i in sorted(message["tool_calls"])]
    return message
