"""Engine configuration: frozen dataclasses, their defaults and their validation, one file per
section (model, cache, scheduler, speculative, parallel; dtypes: the torch-free spellings).

Every user-facing knob (LLM(...) keyword, `ladle serve` flag) maps onto one field here, and every
bad value is rejected at construction with a ValueError that names the field.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from ladle.config.cache import KV_CACHE_DTYPES, CacheConfig
from ladle.config.dtypes import (
    SUPPORTED_DTYPE_NAMES,
    resolve_device,
    resolve_dtype,
    supported_dtypes,
)
from ladle.config.model import (
    CHECKPOINT_FORMATS,
    CHECKPOINT_QUANTIZATIONS,
    LOAD_FORMATS,
    QUANTIZATIONS,
    ModelConfig,
    check_generation_config_folder,
)
from ladle.config.parallel import DISPATCH_MODES, EXECUTOR_BACKENDS, ParallelConfig
from ladle.config.scheduler import PREEMPTION_MODES, SchedulerConfig
from ladle.config.sizes import parse_size_text
from ladle.config.speculative import (
    MAX_SPECULATIVE_TOKENS,
    MODEL_DRAFT_METHODS,
    RANDOM_DRAFT_HEAD,
    SPECULATIVE_METHODS,
    SPECULATIVE_METHODS_LATER,
    SpeculativeConfig,
)
from ladle.config.vllm_settled import without_settled_options

# Every name keeps its old address: `from ladle.config import X` works as before the split.
__all__ = [
    "CHECKPOINT_FORMATS",
    "CHECKPOINT_QUANTIZATIONS",
    "DISPATCH_MODES",
    "EXECUTOR_BACKENDS",
    "KV_CACHE_DTYPES",
    "LOAD_FORMATS",
    "MAX_SPECULATIVE_TOKENS",
    "MODEL_DRAFT_METHODS",
    "PREEMPTION_MODES",
    "QUANTIZATIONS",
    "RANDOM_DRAFT_HEAD",
    "SPECULATIVE_METHODS",
    "SPECULATIVE_METHODS_LATER",
    "SUPPORTED_DTYPE_NAMES",
    "CacheConfig",
    "EngineConfig",
    "ModelConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "SpeculativeConfig",
    "check_generation_config_folder",
    "resolve_device",
    "resolve_dtype",
    "supported_dtypes",
]


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine core needs; built by LLM(...) and `ladle serve`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    @classmethod
    def from_kwargs(cls, model: str | os.PathLike | None = None, **kwargs) -> EngineConfig:
        """Split flat keyword options (as LLM() and the CLI take them) over the sub-configs."""
        sections = {"model": {"model": model}, "cache": {}, "scheduler": {}, "parallel": {}}
        kwargs = without_settled_options(kwargs)
        owners = {
            "model": ModelConfig,
            "cache": CacheConfig,
            "scheduler": SchedulerConfig,
            "parallel": ParallelConfig,
        }
        for key, value in kwargs.items():
            for section, config_class in owners.items():
                fields = {f.name: f for f in dataclasses.fields(config_class)}
                if key in fields:
                    sections[section][key] = _size_or_value(key, fields[key].type, value)
                    break
            else:
                raise ValueError(f"unknown engine option {key!r}")
        return cls(
            model=ModelConfig(**sections["model"]),
            cache=CacheConfig(**sections["cache"]),
            scheduler=SchedulerConfig(**sections["scheduler"]),
            parallel=ParallelConfig(**sections["parallel"]),
        )


def _size_or_value(name: str, annotation: object, value: object) -> object:
    """An integer option given as a string ("4k", "32K", "2048") reads as the CLI reads it, as
    vLLM users write max_model_len; other values pass unchanged to the config's validation."""
    if not isinstance(value, str) or str(annotation).replace(" ", "") not in ("int", "int|None"):
        return value
    try:
        return parse_size_text(value)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
