"""Grammar compilation, the per-request matcher (rollback, reasoning gate) and the manager's
batch bitmask, on the default model's tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

from ladle.core.request import Request
from ladle.model.default_model import resolve_default_model
from ladle.model.tokenizer import load_tokenizer
from ladle.sampling.params import SamplingParams
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


def _rows(*requests) -> list[tuple[str, list[int]]]:
    """One sampling row per request, none after draft tokens."""
    return [(request.request_id, []) for request in requests]


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
    assert manager.fill_bitmask(_rows(plain)) is None  # a batch without grammars pays nothing
    bitmask = manager.fill_bitmask(_rows(plain, constrained))
    assert bitmask.row_indices.tolist() == [1]
    logits = torch.zeros(2, compiler.vocab_size)
    apply_token_bitmask(logits, bitmask.bitmask, bitmask.row_indices)
    assert torch.isfinite(logits[0]).all()
    allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    assert allowed and all(tokenizer.decode([t]).lstrip().startswith("{") for t in allowed)
    text = json.dumps({"unique_field_name_xyz": True})
    manager.accept_tokens(["c"], [tokenizer.encode(text, add_special_tokens=False)[:1]])
    assert manager.remove(["c"]) == []
    assert manager.fill_bitmask(_rows(plain, constrained)) is None


def test_rollback_over_the_end_token_after_a_complete_value(compiler, tokenizer):
    # A stopped matcher does not keep the end token in its history; rolling that token back
    # must not undo the last real token (it did: the token was counted as consumed).
    template = compiler.submit(StructuredOutputsParams(choice=["yes"]).to_grammar()).result(60)
    grammar = RequestGrammar(template.deep_copy())
    vocab_size = compiler.vocab_size
    start = _allowed(grammar.matcher, vocab_size)
    (yes,) = tokenizer.encode("yes", add_special_tokens=False)
    eos = tokenizer.eos_token_ids[0]
    assert grammar.accept(yes)
    assert grammar.matcher.is_stopped()
    assert grammar.accept(eos) and grammar.accept(eos)  # ignore_eos / min_tokens keep going
    grammar.rollback(2)
    assert grammar.matcher.is_stopped() and _allowed(grammar.matcher, vocab_size) == {eos}
    grammar.rollback(1)
    assert _allowed(grammar.matcher, vocab_size) == start
    with pytest.raises(ValueError, match="only 0 were accepted"):
        grammar.rollback(1)


def test_rollback_across_the_reasoning_gate_and_a_stopped_matcher(compiler, tokenizer):
    end = tokenizer.encode("</s>", add_special_tokens=False)
    params = StructuredOutputsParams(choice=["yes"], reasoning_end_token_ids=end)
    grammar = RequestGrammar(compiler.submit(params.to_grammar()).result(60).deep_copy(), end)
    (yes,) = tokenizer.encode("yes", add_special_tokens=False)
    eos = tokenizer.eos_token_ids[0]
    thinking = tokenizer.encode("ok</s>", add_special_tokens=False)
    for token in [*thinking, yes, eos]:
        assert grammar.accept(token)
    grammar.rollback(2)  # the end token (skipped) and "yes" (consumed)
    assert grammar.needs_mask and yes in _allowed(grammar.matcher, compiler.vocab_size)
    grammar.rollback(1)  # the last token of "</s>": the gate closes again
    assert not grammar.needs_mask
    assert grammar.accept(thinking[-1]) and grammar.needs_mask


def test_manager_advances_in_batches_off_the_engine_thread_like_single_matchers(
    compiler, tokenizer
):
    """The manager notes tokens and consumes them in the next fill job (batched, on its worker
    thread): every step's masks equal those of matchers driven one token at a time."""
    import llguidance.torch

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["name", "n"],
    }
    params = StructuredOutputsParams(json=schema)
    compiler.submit(params.to_grammar()).result(60)
    manager = StructuredOutputManager(compiler, torch.device("cpu"))
    texts = ['{"name": "ab", "n": 12}', '{"name": "x", "n": 3}', '{"name": "', "yes"]
    # Per request, the tokens it samples at each step (a list: several when a step accepts
    # more than one, as speculative decoding will).
    steps = [[[t] for t in tokenizer.encode(text, add_special_tokens=False)] for text in texts]
    steps[0][1:3] = [steps[0][1] + steps[0][2]]  # two tokens pending at once, in order
    steps[3] = [steps[3][0]] * 3  # "yes" breaks the schema: that row leaves the mask
    requests = [
        _request(f"r{i}", SamplingParams(structured_outputs={"json": schema}))
        for i in range(len(texts))
    ]
    for request in requests:
        assert manager.add_request(request)  # compiled above: ready at once
    reference = [compiler.submit(params.to_grammar()).result().deep_copy() for _ in texts]
    plain = _request("plain", SamplingParams())
    expected = llguidance.torch.allocate_token_bitmask(1, compiler.vocab_size)
    for step in range(max(map(len, steps))):
        bitmask = manager.fill_bitmask(_rows(plain, *requests))  # row 0 is unconstrained
        live = [i for i, matcher in enumerate(reference) if not matcher.is_error()]
        assert bitmask.row_indices.tolist() == [i + 1 for i in live]
        for mask_row, i in enumerate(live):
            llguidance.torch.fill_next_token_bitmask(reference[i], expected, 0)
            assert torch.equal(bitmask.bitmask[mask_row], expected[0]), (step, i)
        for i, request in enumerate(requests):
            for token in steps[i][step] if step < len(steps[i]) else []:
                manager.accept_tokens([plain.request_id, request.request_id], [[], [token]])
                reference[i].consume_token(token)
    assert reference[3].is_error()
    grammar = manager.grammar_of("r0")  # waits for the job and consumes what is pending
    assert grammar.matcher.is_accepting() and not grammar.matcher.is_error()
    assert manager.grammar_of("r3").matcher.is_error()
    manager.shutdown()
