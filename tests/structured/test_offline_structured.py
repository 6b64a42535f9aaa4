"""SamplingParams(structured_outputs=...) on the offline LLM with the default model: constraints
hold with n > 1, seeds and stop strings, and logprobs stay those of the model."""

from __future__ import annotations

import re

import pytest

from ladle import LLM, SamplingParams
from ladle.structured.params import StructuredOutputsParams


@pytest.fixture(scope="module")
def llm():
    return LLM(cpu_kv_cache_gib=0.25)


def test_regex_choice_and_grammar_offline(llm):
    prompts = ["A product code:", "The capital of France is", "Two plus two:"]
    params = [
        SamplingParams(temperature=1.0, seed=7, n=3, max_tokens=16,
                       structured_outputs={"regex": "[A-Z]{2}-[0-9]{3}"}),
        SamplingParams(temperature=0, max_tokens=8, logprobs=1,
                       structured_outputs=StructuredOutputsParams(choice=["Paris", "Rome"])),
        SamplingParams(temperature=0, max_tokens=16, stop=["."],
                       structured_outputs={"grammar": 'root ::= "It is " [0-9] "."'}),
    ]
    regex, choice, grammar = llm.generate(prompts, params)
    assert len(regex.outputs) == 3
    for sample in regex.outputs:
        assert re.fullmatch("[A-Z]{2}-[0-9]{3}", sample.text), sample.text
    assert choice.outputs[0].text in ("Paris", "Rome")
    # Logprobs come from the model's distribution (vLLM's shape: one {id: Logprob} per token).
    for position in choice.outputs[0].logprobs:
        for entry in position.values():
            assert entry.logprob <= 0.0 and entry.rank >= 1
    # The stop string ends it before the grammar's last character.
    assert re.fullmatch("It is [0-9]", grammar.outputs[0].text), grammar.outputs[0].text


def test_bad_constraint_is_a_value_error():
    with pytest.raises(ValueError, match="regex"):
        SamplingParams(structured_outputs={"regex": "(unclosed"})
    with pytest.raises(ValueError, match="exactly one"):
        SamplingParams(structured_outputs={"regex": "a", "choice": ["a"]})
