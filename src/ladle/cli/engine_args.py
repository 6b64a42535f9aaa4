"""Engine command-line flags, generated from the config dataclasses in `config/`.

Each field of ModelConfig, CacheConfig, SchedulerConfig and ParallelConfig becomes
`--field-name`, with the field's default, its `metadata["help"]` as help text and its type from
the annotation; the
dataclass's own validation runs when the engine config is built. A field added to a config class
is a flag with no change here. vLLM's spellings are the names users paste, so they are accepted
too (ALIASES), and so are ladle's earlier names.

    add_engine_arguments(parser)      # one argument group per config class
    engine_options_from_args(args)    # -> EngineConfig.from_kwargs keywords
    parse_size("32k") == 32000, parse_size("32K") == 32768   (vLLM's convention)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from ladle.cli.durations import parse_duration
from ladle.config import (
    DISPATCH_MODES,
    EXECUTOR_BACKENDS,
    KV_CACHE_DTYPES,
    LOAD_FORMATS,
    PREEMPTION_MODES,
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
)
from ladle.config.sizes import parse_size_text
from ladle.config.vllm_settled import SETTLED_OPTIONS

ENGINE_CONFIG_CLASSES: dict[str, type] = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "parallel": ParallelConfig,
}
# Fields with a flag of their own elsewhere: the model is positional (and --model), the tokenizer
# is a serve flag.
NOT_FLAGS = frozenset({"model", "tokenizer"})
# field -> other spellings accepted for it (vLLM's names, ladle's earlier names).
ALIASES: dict[str, tuple[str, ...]] = {
    "num_kv_blocks": ("--num-gpu-blocks-override",),
    "itl_slo_ms": ("--itl-slo",),
    "tensor_parallel_size": ("-tp",),
    "pipeline_parallel_size": ("-pp",),
    "data_parallel_size": ("-dp",),
}
# field -> the flag that sets it to False (ladle's earlier name for a negated boolean).
NEGATIVE_ALIASES: dict[str, str] = {
    "enable_prefix_caching": "--no-prefix-caching",
    "enable_chunked_prefill": "--no-chunked-prefill",
}
CHOICES: dict[str, tuple[str, ...]] = {
    "load_format": LOAD_FORMATS,
    "kv_cache_dtype": KV_CACHE_DTYPES,
    "distributed_executor_backend": EXECUTOR_BACKENDS,
    "preemption_mode": PREEMPTION_MODES,
    "expert_parallel_dispatch": DISPATCH_MODES,
}


def _duration_ms(text: str) -> float:
    """A duration flag in milliseconds: a bare number is ms; '50ms', '0.05s' carry their unit."""
    stripped = str(text).strip()
    try:
        return float(stripped)
    except ValueError:
        pass
    try:
        return parse_duration(stripped) * 1000.0
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


# field -> the argparse `type` where the annotation alone does not say how to read it.
CONVERTERS = {"itl_slo_ms": _duration_ms}

def parse_size(text: str) -> int:
    """An integer that may carry a size suffix: k/m/g are powers of 1000, K/M/G of 1024."""
    try:
        return parse_size_text(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _parse_json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _converter(annotation: str):
    """The argparse `type` for a field annotation (annotations are strings here)."""
    base = annotation.replace(" ", "").replace("|None", "")
    if base == "int":
        return parse_size
    if base == "float":
        return float
    if base.startswith("dict"):
        return _parse_json_object
    return str


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one argument group per engine config class, each flag generated from its field,
    and vLLM's flags whose usual value is what ladle does (config/vllm_settled.py)."""
    for section, config_class in ENGINE_CONFIG_CLASSES.items():
        group = parser.add_argument_group(
            f"{section} options", (config_class.__doc__ or "").strip().splitlines()[0]
        )
        for field in dataclasses.fields(config_class):
            if field.name in NOT_FLAGS:
                continue
            _add_field_flag(group, field)
    settled = parser.add_argument_group(
        "vLLM flags ladle settles", "accepted so vLLM command lines run; they change nothing"
    )
    settled.add_argument(
        "--trust-remote-code", action="store_true", dest="trust_remote_code",
        help=SETTLED_OPTIONS["trust_remote_code"].why,
    )
    settled.add_argument(
        "--kv-offloading-backend", choices=("native",), default="native",
        dest="kv_offloading_backend", help=SETTLED_OPTIONS["kv_offloading_backend"].why,
    )
    settled.add_argument(
        "--tokenizer-mode", choices=("auto", "hf"), default="auto", dest="tokenizer_mode",
        help=SETTLED_OPTIONS["tokenizer_mode"].why,
    )


def _add_field_flag(group: argparse._ArgumentGroup, field: dataclasses.Field) -> None:
    default = _default_of(field)
    help_text = field.metadata.get("help", "")
    shown_default = json.dumps(default) if isinstance(default, dict) else default
    if default is not None:
        help_text = (
            f"{help_text} (default: {shown_default})" if help_text else f"default: {default}"
        )
    names = [flag_name(field.name), *ALIASES.get(field.name, ())]
    annotation = str(field.type)
    if annotation in ("bool", "bool | None"):  # None: the engine picks (--x / --no-x override)
        group.add_argument(
            *names,
            dest=field.name,
            action=argparse.BooleanOptionalAction,
            default=default,
            help=help_text,
        )
        if field.name in NEGATIVE_ALIASES:
            group.add_argument(
                NEGATIVE_ALIASES[field.name],
                dest=field.name,
                action="store_false",
                help=argparse.SUPPRESS,
            )
        return
    group.add_argument(
        *names,
        dest=field.name,
        type=CONVERTERS.get(field.name) or _converter(annotation),
        default=default,
        choices=CHOICES.get(field.name),
        metavar=field.name.upper() if field.name not in CHOICES else None,
        help=help_text.replace("%", "%%"),
    )


def _default_of(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def engine_options_from_args(args: argparse.Namespace) -> dict:
    """The EngineConfig.from_kwargs keywords the parsed flags set (every generated field)."""
    options = {}
    for config_class in ENGINE_CONFIG_CLASSES.values():
        for field in dataclasses.fields(config_class):
            if field.name not in NOT_FLAGS and hasattr(args, field.name):
                options[field.name] = getattr(args, field.name)
    return options


def expand_config_file(argv: list[str]) -> list[str]:
    """Replace `--config FILE.yaml` with the flags its mapping holds, placed right after the
    subcommand so that flags given on the command line win (as in vLLM).

    Keys are flag names with or without dashes (max-model-len, max_model_len); true/false set a
    boolean flag or its --no- form; lists repeat the flag; mappings are passed as JSON.
    """
    if "--config" not in argv and not any(arg.startswith("--config=") for arg in argv):
        return argv
    remaining: list[str] = []
    path = None
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--config":
            if index + 1 >= len(argv):
                raise ValueError("--config needs a YAML file")
            path = argv[index + 1]
            index += 2
            continue
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            remaining.append(arg)
        index += 1
    import yaml  # only --config reads YAML: PyYAML (~10 ms) stays off every other start-up

    try:
        with open(path) as file:
            mapping = yaml.safe_load(file) or {}
    except OSError as error:
        raise ValueError(f"cannot read --config file {path!r}: {error}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"--config file {path!r} is not valid YAML: {error}") from None
    if not isinstance(mapping, dict):
        raise ValueError(f"--config file {path!r} must hold a mapping of flag names to values")
    flags: list[str] = []
    for key, value in mapping.items():
        name = "--" + str(key).lstrip("-").replace("_", "-")
        if value is True:
            flags.append(name)
        elif value is False:
            flags.append("--no-" + name[2:])
        elif isinstance(value, list):
            for item in value:
                flags += [name, str(item)]
        elif isinstance(value, dict):
            flags += [name, json.dumps(value)]
        elif value is not None:
            flags += [name, str(value)]
    # The subcommand is the first argument; its flags follow it.
    return remaining[:1] + flags + remaining[1:]
