"""Structured output: grammars (through llguidance) that constrain sampling token by token.

params.py     StructuredOutputsParams: what a request asks for (JSON schema, regex, choice, grammar)
bitmask.py    apply_token_bitmask: the allowed-token bitmask applied to the logits, one launch
grammar.py    compile grammars off the engine loop (cached by grammar), one matcher per request
manager.py    the engine core's side: requests waiting on a grammar, the batch bitmask, advancing
"""

from ladle.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
