"""The ids that end generation, read from a model's own files (no tokenizer needed).

With a tokenizer, TextTokenizer merges these with the tokenizer's eos token. Without one
(`skip_tokenizer_init`, random weights of a preset), they are all there is: config.json's
`eos_token_id` (already in the arch config, which GGUF metadata fills too) and
generation_config.json's, which often lists more (a chat model's end of turn), as vLLM stops on
both.
"""

from __future__ import annotations

import json
from pathlib import Path

from ladle.model.arch_config import ModelArchConfig


def folder_eos_token_ids(folder: Path) -> list[int]:
    """eos_token_id of generation_config.json then config.json in a model folder (an int or a
    list in either); files that are absent or unreadable add nothing."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((folder / name).read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        ids += value if isinstance(value, list) else ([] if value is None else [value])
    return [int(token_id) for token_id in ids]


def model_end_token_ids(arch: ModelArchConfig, model_path: str | None) -> tuple[int, ...]:
    """The model's end ids without a tokenizer, first seen first, without repeats."""
    ids = list(arch.eos_token_ids)
    if model_path is not None and Path(model_path).is_dir():
        ids += folder_eos_token_ids(Path(model_path))
    return tuple(dict.fromkeys(ids))
