"""Compare llguidance and xgrammar on the default model's vocabulary (issue 10's choice).

Measures, interleaved over several rounds (medians reported): tokenizer setup, compile time of a
20-field JSON schema (cold: a fresh compiler each round, so nothing is cached), and the time to
fill one row's bitmask per generated token while forcing a valid JSON document through it.

    python scripts/grammar_library_bench.py [--rounds 5]
xgrammar is not a ladle dependency: install it beside (pip install --target DIR xgrammar) and put
DIR on PYTHONPATH to include it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ladle.model.default_model import resolve_default_model
from ladle.model.tokenizer import load_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "name": {"type": "string"},
        "email": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "score": {"type": "number"},
        "active": {"type": "boolean"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
            "required": ["street", "city"],
        },
        "phone": {"type": "string"},
        "country": {"type": "string"},
        "zip": {"type": "string"},
        "created": {"type": "string"},
        "updated": {"type": "string"},
        "notes": {"type": "string"},
        "level": {"type": "integer"},
        "ratio": {"type": "number"},
        "verified": {"type": "boolean"},
        "manager": {"type": ["string", "null"]},
        "ids": {"type": "array", "items": {"type": "integer"}},
    },
    "required": [
        "id",
        "name",
        "email",
        "age",
        "score",
        "active",
        "role",
        "tags",
        "address",
        "phone",
        "country",
        "zip",
        "created",
        "updated",
        "notes",
        "level",
        "ratio",
        "verified",
        "manager",
        "ids",
    ],
    "additionalProperties": False,
}
DOCUMENT = {
    "id": 7,
    "name": "Ada Lovelace",
    "email": "ada@example.com",
    "age": 36,
    "score": 9.5,
    "active": True,
    "role": "admin",
    "tags": ["math", "engines"],
    "address": {"street": "12 St James's Square", "city": "London"},
    "phone": "+44 20 7946",
    "country": "UK",
    "zip": "SW1Y",
    "created": "1843-01-01",
    "updated": "1852-11-27",
    "notes": "first programmer",
    "level": 3,
    "ratio": 0.25,
    "verified": False,
    "manager": None,
    "ids": [1, 2, 3],
}


def bench_llguidance(hf_tokenizer, vocab_size: int, tokens: list[int]) -> dict[str, float]:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    start = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    matcher = llguidance.LLMatcher(lltok, grammar)
    assert not matcher.is_error(), matcher.get_error()
    compile_s = time.perf_counter() - start
    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab_size)
    fill = []
    for token in tokens:
        start = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        fill.append(time.perf_counter() - start)
        assert matcher.consume_token(token), matcher.get_error()
    return {
        "setup_s": setup,
        "compile_s": compile_s,
        "mask_us": statistics.median(fill) * 1e6,
        "mask_max_us": max(fill) * 1e6,
    }


def bench_xgrammar(hf_tokenizer, vocab_size: int, tokens: list[int]) -> dict[str, float]:
    import xgrammar

    start = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size)
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    matcher = xgrammar.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - start
    bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
    fill = []
    for token in tokens:
        start = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask, 0)
        fill.append(time.perf_counter() - start)
        assert matcher.accept_token(token)
    return {
        "setup_s": setup,
        "compile_s": compile_s,
        "mask_us": statistics.median(fill) * 1e6,
        "mask_max_us": max(fill) * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tokenizer = load_tokenizer(str(resolve_default_model()))
    hf = tokenizer.hf_tokenizer
    vocab_size = len(hf)
    tokens = hf.encode(json.dumps(DOCUMENT), add_special_tokens=False)
    runners = {"llguidance": bench_llguidance}
    try:
        import xgrammar  # noqa: F401

        runners["xgrammar"] = bench_xgrammar
    except ImportError:
        pass
    results: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, run in runners.items():
            results[name].append(run(hf, vocab_size, tokens))
    print(
        f"vocab={vocab_size} tokens per document={len(tokens)} rounds={args.rounds} "
        f"torch threads={torch.get_num_threads()}"
    )
    for name, rows in results.items():
        summary = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        print(
            f"{name:11s} tokenizer setup {summary['setup_s'] * 1e3:8.1f} ms | 20-field "
            f"compile {summary['compile_s'] * 1e3:8.2f} ms | mask/token median "
            f"{summary['mask_us']:7.1f} us, worst {summary['mask_max_us']:8.1f} us"
        )


if __name__ == "__main__":
    main()
