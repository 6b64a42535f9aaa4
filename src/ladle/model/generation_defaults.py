"""The model's own sampling defaults, as vLLM's `--generation-config auto` applies them.

Model authors ship recommended sampling settings in `generation_config.json` (Qwen3: temperature
0.6, top_p 0.95, top_k 20), and llama.cpp's converter copies them into GGUF metadata
(`general.sampling.*`). With generation_config='auto' (the default) they become the defaults of
every request that does not set the field; 'vllm' (or 'ladle') keeps ladle's defaults
(temperature 1, no truncation); a folder path reads that folder's generation_config.json.
generation_config.json's `max_new_tokens` becomes `max_tokens`, which in vLLM's reading (and the
server's, entrypoints/openai/sampling.py) is the default of requests that give none and a
ceiling on those that ask more; GGUF metadata has no such key.
--override-generation-config's values (config/generation_overrides.py) are laid on top, whatever
generation_config says, as vLLM does.

    read_generation_defaults(model_path, "auto") -> {"temperature": 0.6, "top_p": 0.95, ...}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ladle.config.generation_overrides import sampling_overrides

GENERATION_CONFIG_FILE = "generation_config.json"
OFF_VALUES = ("vllm", "ladle")
# generation_config.json key -> SamplingParams field
_HF_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
}
# Not a sampling field: transformers honours it under greedy decoding (do_sample false) too.
_HF_LENGTH_KEY = "max_new_tokens"
# GGUF metadata key -> SamplingParams field (llama.cpp's general.sampling.* names)
_GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


def read_generation_defaults(model_path: str | None, generation_config: str) -> dict[str, Any]:
    """The sampling defaults the model supplies; {} when it supplies none or they are off.

    Raises ValueError when generation_config names a folder without a generation_config.json.
    """
    if generation_config in OFF_VALUES or model_path is None:
        return {}
    if generation_config != "auto":
        folder = Path(generation_config).expanduser()
        if not (folder / GENERATION_CONFIG_FILE).is_file():
            raise ValueError(
                f"generation_config {generation_config!r} is neither 'auto', 'vllm' nor a folder "
                f"holding a {GENERATION_CONFIG_FILE}"
            )
        return _from_json(folder / GENERATION_CONFIG_FILE)
    path = Path(model_path)
    if path.is_dir():
        return _from_json(path / GENERATION_CONFIG_FILE)
    if path.suffix.lower() == ".gguf" and path.is_file():
        return _from_gguf(path)
    return {}


def describe_defaults(defaults: dict[str, Any], overridden: bool = False) -> str:
    """One log line naming what was applied, and how to turn it off."""
    settings = ", ".join(f"{name}={value}" for name, value in defaults.items())
    source = "the model's generation config"
    if overridden:
        source += " and --override-generation-config"
    kept = "requests that set a field keep their value"
    if "max_tokens" in defaults:
        kept += f", but a served request generates at most max_tokens={defaults['max_tokens']}"
    return (
        f"[ladle] sampling defaults from {source}: {settings} ({kept}; --generation-config "
        "vllm turns the model's off)"
    )


def _from_json(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {str(path)!r}: {error}") from error
    if not isinstance(config, dict):
        return {}
    # do_sample=false means greedy in transformers; its sampling fields are then unused.
    values = {}
    if config.get("do_sample") is not False:
        values = {field: config.get(key) for key, field in _HF_KEYS.items()}
    values["max_tokens"] = config.get(_HF_LENGTH_KEY)  # after the sampling fields in the log
    return _clean(values)


def _from_gguf(path: Path) -> dict[str, Any]:
    from ladle.model.loader.gguf_header import read_gguf_header

    try:
        fields = read_gguf_header(path).fields
    except (OSError, ValueError):
        return {}  # the loader reports a bad file; defaults are not the place to fail
    return _clean({field: fields.get(key) for key, field in _GGUF_KEYS.items()})


def _clean(values: dict[str, Any]) -> dict[str, Any]:
    cleaned: dict[str, Any] = {}
    for field, value in values.items():
        if value is None or isinstance(value, bool):
            continue
        if hasattr(value, "item"):  # a numpy scalar from a GGUF header
            value = value.item()
        if not isinstance(value, (int, float)):
            continue
        if field == "top_k":
            value = int(value)
            if value <= 0:  # 0 means "off" in transformers and llama.cpp; -1 in ladle
                continue
        elif field == "max_tokens":
            # A count below 1 or a fraction is no max_tokens; a model file holding one supplies
            # no length rather than stopping the server (as with the other fields).
            if value < 1 or not float(value).is_integer():
                continue
            value = int(value)
        else:
            value = float(value)
            # Values equal to ladle's own defaults change nothing; leave them out of the log.
            if (field, value) in {("top_p", 1.0), ("min_p", 0.0), ("repetition_penalty", 1.0)}:
                continue
        cleaned[field] = value
    return cleaned


def sampling_defaults_of(
    model_path: str | None, generation_config: str, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """read_generation_defaults with the overrides laid on top (SamplingParams field names;
    max_new_tokens becomes max_tokens), printing what was applied (the start-up log shows it)."""
    defaults = read_generation_defaults(model_path, generation_config)
    laid_over = sampling_overrides(overrides)
    defaults.update(laid_over)
    if defaults:
        print(describe_defaults(defaults, overridden=bool(laid_over)), flush=True)
    return defaults
