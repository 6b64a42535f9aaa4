"""Load the tokenizer on a thread while the engine loads the model (in this process for LLM,
in the engine process while the API process waits for it when serving).

Most of a tokenizer's load is importing transformers and parsing tokenizer.json; most of a
model's is torch work that releases the GIL (reading, dequantizing, quantizing). On a small
machine doing both at once saves about a second of start-up; with an empty ladle cache, random
weights of a preset fetch the default model and convert its GGUF tokenizer (~10 s on a small
CPU) beside the engine instead of after it. The thread starts only when the tokenizer's source is
known before the model loads (a local file or folder, --tokenizer, or random weights);
otherwise, and whenever the guess turns out wrong, the tokenizer loads after the model as
before.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ladle.config import ModelConfig
from ladle.frontend.tokenizer_source import resolve_tokenizer_source
from ladle.model.arch_config import ModelArchConfig
from ladle.model.default_model import DefaultModelUnavailableError, resolve_default_model
from ladle.model.tokenizer import TextTokenizer, load_tokenizer

# Where the preload's source is "the default model, fetched if need be" (random weights of a
# preset): the thread resolves it, as resolve_tokenizer_source would after the load.
DEFAULT_MODEL_SOURCE = "<the default model>"


class TokenizerPreload:
    """Start with the model config before the engine; `result` once the engine is built."""

    def __init__(self, model_config: ModelConfig) -> None:
        self._model_config = model_config
        self._source = _source_known_before_loading(model_config)
        self._future: Future[tuple[str | None, TextTokenizer | None]] | None = None
        if self._source is not None:
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ladle-tokenizer")
            self._future = executor.submit(_load, self._source)
            executor.shutdown(wait=False)

    def result(self, model_path: str | None, arch: ModelArchConfig) -> TextTokenizer | None:
        """The tokenizer the model runs with (None: none), with the model's end ids."""
        if self._future is not None:
            # Before resolving: a default model the thread is still fetching is fetched once.
            self._future.exception()
        return self.result_for(resolve_tokenizer_source(self._model_config, model_path), arch)

    def result_for(self, source: str | None, arch: ModelArchConfig) -> TextTokenizer | None:
        """As result(), given the tokenizer source the engine resolved (the server's case)."""
        if self._future is not None:
            # A load error is raised here, as it would be; the default model's absence is not
            # (resolve_tokenizer_source already said why the model runs without a tokenizer).
            preloaded_source, preloaded = self._future.result()
            if preloaded is not None and source == preloaded_source:
                return TextTokenizer(
                    preloaded.hf_tokenizer, [*arch.eos_token_ids, *preloaded.eos_token_ids]
                )
        if source is None:
            return None
        return load_tokenizer(source, arch)

    def cancel(self) -> None:
        """The engine failed to load: do not leave the thread's result (or error) unread."""
        if self._future is not None:
            self._future.cancel()


def _load(source: str) -> tuple[str | None, TextTokenizer | None]:
    """(the source loaded, its tokenizer without the model's end ids: result_for merges them)."""
    if source == DEFAULT_MODEL_SOURCE:
        try:
            source = str(resolve_default_model(show_progress=False))
        except DefaultModelUnavailableError:
            return None, None
    return source, load_tokenizer(source, None)


def _source_known_before_loading(model_config: ModelConfig) -> str | None:
    if model_config.skip_tokenizer_init:
        return None
    if model_config.tokenizer:
        return model_config.tokenizer
    if model_config.load_format == "dummy":
        return _dummy_tokenizer_source(model_config.model)
    if not model_config.model:
        return None
    return model_config.model if Path(model_config.model).expanduser().exists() else None


def _dummy_tokenizer_source(model: str | None) -> str:
    """Random weights of a local config.json folder use that folder's tokenizer; of a preset,
    the default model's (fetched on the thread when not cached: a cold cache converts its GGUF
    tokenizer for seconds, which then overlap the engine's start-up). The preset table is not
    consulted: it lives in the loader package, which imports torch, and the API process must
    not (a name that is no preset fails the load, which cancels this preload)."""
    path = Path(model).expanduser() if model else None
    if path is not None and path.is_dir():
        return str(path)
    return DEFAULT_MODEL_SOURCE
