"""TextTokenizer: text <-> token ids, chat templates and end-of-turn ids for one model.

It wraps a Hugging Face tokenizer loaded from a model folder or built from a GGUF file's
embedded vocabulary. Building one from a GGUF takes seconds, so the result is saved in the ladle
cache and loaded from there next time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ladle.model.arch_config import ModelArchConfig
from ladle.model.default_model import default_cache_dir
from ladle.model.end_tokens import folder_eos_token_ids
from ladle.model.load_errors import ModelLoadError

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
# ChatML ends a turn with <|im_end|>; <|im_start|> opens one and must never stop generation, even
# though tokenizers converted from GGUF files name it as their eos token.
CHATML_END_OF_TURN = "<|im_end|>"
CHATML_START_OF_TURN = "<|im_start|>"
_LADLE_METADATA_FILE = "ladle_tokenizer.json"


class TextTokenizer:
    """A model's tokenizer: encode, decode, chat templates, and the ids that end generation."""

    def __init__(self, hf_tokenizer: Any, config_eos_token_ids: Iterable[int] = ()) -> None:
        """config_eos_token_ids: end ids from the model's config or generation config."""
        self._hf_tokenizer = hf_tokenizer
        self._eos_token_ids = _end_token_ids(hf_tokenizer, tuple(config_eos_token_ids))

    @property
    def hf_tokenizer(self) -> Any:
        """The underlying transformers tokenizer (the incremental detokenizer works on it)."""
        return self._hf_tokenizer

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every token id that ends a generation."""
        return self._eos_token_ids

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce, added tokens included."""
        return len(self._hf_tokenizer)

    @property
    def all_special_ids(self) -> list[int]:
        return list(self._hf_tokenizer.all_special_ids)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._hf_tokenizer, "chat_template", None))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._hf_tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._hf_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The prompt text the tokenizer's chat template makes of the messages.

        Raises ValueError when there is no template or the messages are malformed.
        """
        if not self.has_chat_template and kwargs.get("chat_template") is None:
            raise ValueError(
                "this tokenizer has no chat template; send a plain prompt instead of messages"
            )
        validate_chat_messages(messages)
        from jinja2 import TemplateError

        try:
            text = self._hf_tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
            )
        except TemplateError as error:
            # Templates raise_exception() on conversations they reject (say, two user turns).
            raise ValueError(f"the chat template rejected these messages: {error}") from error
        return text

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any
    ) -> list[int]:
        """Token ids of the messages rendered by the tokenizer's own chat template.

        Extra keyword arguments reach the template (tools=..., enable_thinking=...).
        """
        text = self.render_chat_template(messages, add_generation_prompt, **kwargs)
        # The template already wrote the special tokens (a bos, if the model wants one).
        return self.encode(text, add_special_tokens=False)


def validate_chat_messages(messages: Any) -> None:
    """Raise ValueError naming the first problem in an OpenAI-style message list."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            # ValueError, not TypeError: every bad request is a ValueError (an HTTP 400).
            raise ValueError(  # noqa: TRY004
                f"messages[{index}] must be a dict, got {type(message).__name__}"
            )
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise ValueError(
                f"messages[{index}] has role {role!r}; "
                f"expected one of {', '.join(sorted(CHAT_ROLES))}"
            )
        content = message.get("content")
        # An assistant turn that only calls tools has no text.
        if content is None and role == "assistant" and message.get("tool_calls"):
            continue
        if not isinstance(content, str):
            raise ValueError(  # noqa: TRY004
                f"messages[{index}] content must be a string, got {type(content).__name__}"
            )


def _end_token_ids(hf_tokenizer: Any, config_eos_token_ids: tuple[int, ...]) -> tuple[int, ...]:
    ids: list[int] = []
    for token_id in (*config_eos_token_ids, hf_tokenizer.eos_token_id):
        if token_id is not None and int(token_id) not in ids:
            ids.append(int(token_id))
    template = getattr(hf_tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates: any of them may be ChatML
        template = "\n".join(template.values())
    if CHATML_END_OF_TURN in template:
        end_of_turn = _token_id(hf_tokenizer, CHATML_END_OF_TURN)
        start_of_turn = _token_id(hf_tokenizer, CHATML_START_OF_TURN)
        if end_of_turn is not None and end_of_turn not in ids:
            ids.append(end_of_turn)
        if start_of_turn is not None and start_of_turn in ids:
            ids.remove(start_of_turn)
    return tuple(ids)


def _token_id(hf_tokenizer: Any, token: str) -> int | None:
    token_id = hf_tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == hf_tokenizer.unk_token_id:
        return None
    return int(token_id)


def load_tokenizer(
    model_path: str,
    arch_config: ModelArchConfig | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> TextTokenizer:
    """Load the tokenizer of a Hugging Face model folder (or hub id) or of a .gguf file.

    arch_config: the model's config, whose eos ids join the tokenizer's end ids.
    cache_dir: where tokenizers converted from GGUF files are kept (default: the ladle cache).
    Remote code is never run.
    """
    path = Path(model_path).expanduser()
    if path.suffix == ".gguf" or path.is_file():
        # A model given as one file can only be a GGUF file; the GGUF reader says if it is not.
        return _load_gguf_tokenizer(path, arch_config, cache_dir)
    from transformers import AutoTokenizer

    try:
        hf_tokenizer = AutoTokenizer.from_pretrained(str(model_path), trust_remote_code=False)
    except Exception as error:
        raise ModelLoadError(
            f"cannot load a tokenizer from {str(model_path)!r} ({type(error).__name__}: {error})"
        ) from error
    config_eos = list(arch_config.eos_token_ids) if arch_config is not None else []
    if path.is_dir():
        config_eos += folder_eos_token_ids(path)
    return TextTokenizer(hf_tokenizer, config_eos)


def gguf_tokenizer_cache_folder(gguf_path: Path, cache_dir: str | os.PathLike | None) -> Path:
    """The folder holding the tokenizer converted from one GGUF file.

    Keyed by the file's path, size and mtime (hashing gigabytes at every start would cost more
    than the conversion saves) and by the transformers version that did the conversion.
    """
    import transformers

    stat = gguf_path.stat()
    identity = f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return root / "tokenizers" / f"{gguf_path.stem}-{key}"


def _load_gguf_tokenizer(
    gguf_path: Path, arch_config: ModelArchConfig | None, cache_dir: str | os.PathLike | None
) -> TextTokenizer:
    from transformers import AutoTokenizer

    if not gguf_path.is_file():
        raise ModelLoadError(f"GGUF file {str(gguf_path)!r} does not exist")
    folder = gguf_tokenizer_cache_folder(gguf_path, cache_dir)
    if (folder / _LADLE_METADATA_FILE).is_file():
        try:
            metadata = json.loads((folder / _LADLE_METADATA_FILE).read_text())
            hf_tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
            return TextTokenizer(hf_tokenizer, _config_eos(arch_config, metadata["eos_token_ids"]))
        except Exception:  # noqa: BLE001 - a damaged cache entry is rebuilt, never fatal
            shutil.rmtree(folder, ignore_errors=True)

    from ladle.model.loader.gguf import read_gguf_eos_token_ids

    # Reading the header also turns a corrupt file into a ModelLoadError before transformers
    # gets to fail on it less clearly.
    file_eos = list(read_gguf_eos_token_ids(gguf_path))
    try:
        hf_tokenizer = AutoTokenizer.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, trust_remote_code=False
        )
    except Exception as error:
        raise ModelLoadError(
            f"cannot build a tokenizer from GGUF file {str(gguf_path)!r} "
            f"({type(error).__name__}: {error})"
        ) from error
    _save_to_cache(hf_tokenizer, folder, {"eos_token_ids": file_eos})
    return TextTokenizer(hf_tokenizer, _config_eos(arch_config, file_eos))


def _config_eos(arch_config: ModelArchConfig | None, file_eos: list[int]) -> list[int]:
    return (list(arch_config.eos_token_ids) if arch_config is not None else []) + list(file_eos)


def _save_to_cache(hf_tokenizer: Any, folder: Path, metadata: dict) -> None:
    """Save into a private folder, then rename it into place: readers never see half a save, and
    of two processes converting at once the first rename wins and the other is discarded."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    except OSError:
        return  # a read-only cache only costs the conversion time next start
    try:
        hf_tokenizer.save_pretrained(str(staging))
        (staging / _LADLE_METADATA_FILE).write_text(json.dumps(metadata))
        os.chmod(staging, 0o755)
        os.rename(staging, folder)
    except OSError:
        pass  # another process got there first, or the disk is full: both are harmless
    finally:
        shutil.rmtree(staging, ignore_errors=True)
