"""bad_words: words a request must never generate (vLLM's SamplingParams.bad_words).

Each word becomes token sequences once, with the tokenizer, when the request arrives
(`bad_words_token_ids`): the word as written and, when a leading space tokenizes it into as
many tokens with a different first one, the word after a space, since most tokenizers spell a
word differently mid-sentence. At each step a sequence's last token is banned when the tokens
generated so far end with the rest of the sequence; a one-token word is always banned. Only
generated tokens count, as in vLLM: a word the prompt ends in half-way may still be finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def bad_words_token_ids(bad_words: Sequence[str], tokenizer: Any) -> list[list[int]]:
    """The token sequences of each word (tokenizer: anything with encode(text, bool))."""
    sequences: list[list[int]] = []
    for word in bad_words:
        plain = list(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        if not plain:
            raise ValueError(f"bad_words: {word!r} encodes to no tokens")
        sequences.append(plain)
        spaced = list(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if len(spaced) == len(plain) and spaced[0] != plain[0]:
            sequences.append(spaced)
    return sequences


def banned_by_bad_words(
    sequences: Sequence[Sequence[int]], output_token_ids: Sequence[int]
) -> list[int]:
    """The token ids one request may not sample next, given what it generated so far."""
    banned = []
    for sequence in sequences:
        prefix_length = len(sequence) - 1
        if prefix_length > len(output_token_ids):
            continue
        if prefix_length == 0 or list(output_token_ids[-prefix_length:]) == list(sequence[:-1]):
            banned.append(sequence[-1])
    return banned
