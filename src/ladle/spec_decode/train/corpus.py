"""ShareGPT conversations used as they are: teacher-forced training sequences (the target reads
the conversation's own text, no answer is generated, and its next-token distribution at every
position is the label) and token counts for choosing the draft vocabulary.

Why: on a CPU, generating the target's answers costs about as much per token as the feature
pass itself, and only the answer positions of a generated sequence used to carry a label; a
teacher-forced conversation costs the feature pass alone and labels every position. EAGLE-1
trained on fixed ShareGPT text and found it close to regenerated data.

The conversations come from the end of the same seeded shuffle the prompts come from, and any
whose first human turn is one of the prompts (training or held out) is skipped, so the held-out
measurement never sees its prompts in training.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from ladle.spec_decode.train.data import shuffled_sharegpt_records

# ShareGPT's speaker names -> chat template roles (other speakers, e.g. "system", are skipped).
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "assistant": "assistant",
    "bing": "assistant",
    "bard": "assistant",
}


def sharegpt_conversations(
    count: int, seed: int, exclude_prompts: Iterable[str]
) -> list[list[dict[str, str]]]:
    """`count` ShareGPT conversations as chat messages ({"role", "content"}), taken from the end
    of the seed's shuffle, skipping those whose first human turn is in `exclude_prompts`, those
    not opening with a human turn and those with no assistant turn."""
    if count <= 0:
        return []
    # The same shuffle as sharegpt_prompts, read from its end: prompts come from its start.
    records = shuffled_sharegpt_records(
        seed, "teacher_forced / vocab_conversations: ShareGPT conversations", "or pass 0"
    )
    excluded = {prompt.strip() for prompt in exclude_prompts}
    conversations: list[list[dict[str, str]]] = []
    for record in reversed(records):
        messages = _messages(record.get("conversations") or [])
        if not messages or messages[0]["role"] != "user":
            continue
        if messages[0]["content"] in excluded:
            continue
        if not any(message["role"] == "assistant" for message in messages):
            continue
        conversations.append(messages)
        if len(conversations) == count:
            break
    return conversations


def _messages(turns: list[dict]) -> list[dict[str, str]]:
    messages = []
    for turn in turns:
        role = ROLES.get(str(turn.get("from", "")).lower())
        text = (turn.get("value") or "").strip()
        if role is None or not text:
            continue
        if messages and messages[-1]["role"] == role:
            # Two turns of one speaker in a row (ShareGPT has some): one message, as templates
            # expect roles to alternate.
            messages[-1]["content"] += "\n\n" + text
        else:
            messages.append({"role": role, "content": text})
    return messages


def encode_conversation(tokenizer, messages: list[dict[str, str]], max_len: int) -> list[int]:
    """The conversation's token ids through the tokenizer's chat template (its turns joined by
    blank lines when it has none), cut to the first `max_len`."""
    hf = getattr(tokenizer, "hf_tokenizer", tokenizer)
    if getattr(hf, "chat_template", None):
        text = hf.apply_chat_template(messages, tokenize=False)
        ids = hf.encode(text, add_special_tokens=False)
    else:
        ids = tokenizer.encode("\n\n".join(message["content"] for message in messages))
    return list(ids)[:max_len]


def teacher_forced_sequences(
    tokenizer, conversations: Sequence[list[dict[str, str]]], max_len: int, min_len: int
) -> list[tuple[list[int], int]]:
    """(token ids, prompt length 1) of each conversation at least `min_len` tokens long: every
    position after the first token is a label (the pipeline's (ids, prompt length) form)."""
    sequences = []
    for messages in conversations:
        ids = encode_conversation(tokenizer, messages, max_len)
        if len(ids) >= min_len:
            sequences.append((ids, 1))
    return sequences


def corpus_token_counts(tokenizer, conversations: Sequence[list[dict[str, str]]]) -> Counter[int]:
    """How often each token id occurs in the conversations' text (all turns, no template):
    cheap (a fast tokenizer reads ~10^5 tokens a second), so many more conversations than the
    training sequences can inform the draft vocabulary."""
    hf = getattr(tokenizer, "hf_tokenizer", tokenizer)
    counts: Counter[int] = Counter()
    for messages in conversations:
        for message in messages:
            counts.update(hf.encode(message["content"], add_special_tokens=False))
    return counts
