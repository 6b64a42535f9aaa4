"""Grammar compilation, the per-request matcher (rollback, reasoning gate) and the manager's
batch bitmask, on the default model's tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

from ladle.core.request import Request
from ladle.engine.tokenizer import load_tokenizer
from ladle.model.default_model import resolve_default_model
from ladle.sampling_params import SamplingParams
from ladle.structured.bitmask import apply_token_bitmask
from ladle.structured.grammar import GrammarCompiler, RequestGrammar
from ladle.structured.manager import StructuredOutputManager
from ladle.structured.params import StructuredOutputsParams


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(str(resolve_default_model()))


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(lambda: tokenizer, len(tokenizer.hf_tokenizer))


def _allowed(manager_or_matcher, vocab_size) -> set[int]:
    import llguidance.torch

    mask = llguidance.torch.allocate_token_bitmask(1, vocab_size)
    llguidance.torch.fill_next_token_bitmask(manager_or_matcher, mask, 0)
    logits = torch.zeros(1, vocab_size)
    apply_token_bitmask(logits, mask, torch.tensor([0]))
    return set(torch.isfinite(logits[0]).nonzero().flatten().tolist())


def test_compiles_once_per_grammar(compiler):
    grammar = StructuredOutputsParams(choice=["alpha", "beta"]).to_grammar()
    first = compiler.submit(grammar)
    assert compiler.submit(grammar) is first
    assert not first.result(timeout=60).is_error()


def test_matcher_follows_the_text_and_rolls_back(compiler, tokenizer):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    template = compiler.submit(StructuredOutputsParams(json=schema).to_grammar()).result(60)
    grammar = RequestGrammar(template.deep_copy())
    tokens = tokenizer.encode('{"n": 42}', add_special_tokens=False)
    vocab_size = compiler.vocab_size
    masks = []
    for token in tokens:
        allowed = _allowed(grammar.matcher, vocab_size)
        assert token in allowed
        masks.append(allowed)
        assert grammar.accept(token)
    eos = tokenizer.eos_token_ids[0]
    assert _allowed(grammar.matcher, vocab_size) == {eos}  # the value is complete
    grammar.rollback(2)
    assert _allowed(grammar.matcher, vocab_size) == masks[-2]
    assert all(grammar.accept(token) for token in tokens[-2:])
    grammar.rollback(1)
    assert not grammar.accept(tokenizer.encode("x", add_special_tokens=False)[0])
    assert not grammar.needs_mask  # a matcher in error leaves the request unconstrained


def test_reasoning_gate_constrains_only_after_the_end_of_thinking(compiler, tokenizer):
    params = StructuredOutputsParams(
        choice=["yes"], reasoning_end_token_ids=tokenizer.encode("</s>", add_special_tokens=False)
    )
    grammar = RequestGrammar(
        compiler.submit(params.to_grammar()).result(60).deep_copy(),
        params.reasoning_end_token_ids,
    )
    assert not grammar.needs_mask
    for token in tokenizer.encode("hmm, let me think</s>", add_special_tokens=False):
        assert grammar.accept(token)
    assert grammar.needs_mask
    grammar.rollback(1)
    assert not grammar.needs_mask


def _request(request_id: str, params: SamplingParams) -> Request:
    return Request(request_id=request_id, prompt_token_ids=[1, 2, 3], sampling_params=params)


def test_manager_masks_only_constrained_rows_and_holds_compiling_requests(compiler, tokenizer):
    manager = StructuredOutputManager(compiler, torch.device("cpu"))
    schema = {"type": "object", "properties": {"unique_field_name_xyz": {"type": "boolean"}}}
    constrained = _request("c", SamplingParams(structured_outputs={"json": schema}))
    plain = _request("p", SamplingParams())
    ready_now = manager.add_request(constrained)  # a new grammar: it waits while it compiles
    if not ready_now:
        manager.wait_for_compile(60)
        ready, failed = manager.take_ready()
        assert ready == [constrained] and not failed
    assert manager.fill_bitmask([plain]) is None  # a batch without grammars pays nothing
    bitmask = manager.fill_bitmask([plain, constrained])
    assert bitmask.row_indices.tolist() == [1]
    logits = torch.zeros(2, compiler.vocab_size)
    apply_token_bitmask(logits, bitmask.bitmask, bitmask.row_indices)
    assert torch.isfinite(logits[0]).all()
    allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    assert allowed and all(tokenizer.decode([t]).lstrip().startswith("{") for t in allowed)
    text = json.dumps({"unique_field_name_xyz": True})
    manager.accept_tokens([constrained], tokenizer.encode(text, add_special_tokens=False)[:1])
    assert manager.remove(["c"]) == []
    assert manager.fill_bitmask([plain, constrained]) is None
