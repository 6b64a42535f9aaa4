"""Load the tokenizer on a thread while the engine loads the model (in this process for LLM,
in the engine process while the API process waits for it when serving).

Most of a tokenizer's load is importing transformers and parsing tokenizer.json; most of a
model's is torch work that releases the GIL (reading, dequantizing, quantizing). On a small
machine doing both at once saves about a second of start-up. The thread starts only when the
tokenizer's source is known before the model loads (a local file or folder, or --tokenizer);
otherwise, and whenever the guess turns out wrong, the tokenizer loads after the model as
before.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ladle.config import ModelConfig
from ladle.frontend.tokenizer_source import resolve_tokenizer_source
from ladle.model.arch_config import ModelArchConfig
from ladle.model.tokenizer import TextTokenizer, load_tokenizer


class TokenizerPreload:
    """Start with the model config before the engine; `result` once the engine is built."""

    def __init__(self, model_config: ModelConfig) -> None:
        self._model_config = model_config
        self._source = _source_known_before_loading(model_config)
        self._future: Future[TextTokenizer] | None = None
        if self._source is not None:
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ladle-tokenizer")
            # Without the model's config: its end ids are merged in by result().
            self._future = executor.submit(load_tokenizer, self._source, None)
            executor.shutdown(wait=False)

    def result(self, model_path: str | None, arch: ModelArchConfig) -> TextTokenizer | None:
        """The tokenizer the model runs with (None: none), with the model's end ids."""
        return self.result_for(resolve_tokenizer_source(self._model_config, model_path), arch)

    def result_for(self, source: str | None, arch: ModelArchConfig) -> TextTokenizer | None:
        """As result(), given the tokenizer source the engine resolved (the server's case)."""
        if self._future is not None:
            preloaded = self._future.result()  # a load error is raised here, as it would be
            if source == self._source:
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


def _source_known_before_loading(model_config: ModelConfig) -> str | None:
    if model_config.tokenizer:
        return model_config.tokenizer
    if model_config.load_format == "dummy":
        return _dummy_tokenizer_source(model_config.model)
    if not model_config.model:
        return None
    return model_config.model if Path(model_config.model).expanduser().exists() else None


def _dummy_tokenizer_source(model: str | None) -> str | None:
    """Random weights of a local config.json folder use that folder's tokenizer; of a preset,
    the default model's, known before loading when that model is cached (a fetch is left to
    resolve_tokenizer_source, after the load). The preset table is not consulted: it lives in
    the loader package, which imports torch, and the API process must not (a name that is no
    preset fails the load, which cancels this preload)."""
    from ladle.model.default_model import default_model_if_cached

    path = Path(model).expanduser() if model else None
    if path is not None and path.is_dir():
        return str(path)
    cached = default_model_if_cached()
    return str(cached) if cached is not None else None
