"""ModelConfig: which model, in which dtype and quantization, from which files."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ladle.config.dtypes import SUPPORTED_DTYPE_NAMES, is_torch_dtype
from ladle.config.generation_overrides import sampling_overrides
from ladle.sampling.limits import LIMITS

if TYPE_CHECKING:
    import torch


LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
# vLLM's --quantization names for checkpoint formats (and its Marlin kernels' spellings of
# them): ladle loads such a checkpoint with the method its quantization_config names, as with
# auto, and refuses a model that is not one.
CHECKPOINT_QUANTIZATIONS = {
    "gptq": "gptq",
    "gptq_marlin": "gptq",
    "awq": "awq",
    "awq_marlin": "awq",
    "compressed-tensors": "compressed-tensors",
}
QUANTIZATIONS = ("auto", "none", "int8", "fp8", "int4", "gguf", *CHECKPOINT_QUANTIZATIONS)
# The tensor layouts `ladle quantize --format` writes (model/loader/quantized_formats.py); named
# here, torch-free, because the CLI's parser is built in the API process.
CHECKPOINT_FORMATS = ("hf-fp8", "gptq", "awq", "ladle", "compressed-tensors")


def check_generation_config_folder(folder: str) -> None:
    """generation_config other than auto/vllm must be a folder holding generation_config.json."""
    from pathlib import Path

    if not (Path(folder).expanduser() / "generation_config.json").is_file():
        raise ValueError(
            f"generation_config {folder!r} is neither 'auto', 'vllm' nor a folder holding a "
            "generation_config.json"
        )


@dataclass(frozen=True)
class ModelConfig:
    """Which weights to load and how.

    model: a Hugging Face folder, a .gguf file, a dummy preset name (with load_format='dummy'),
    or None for the embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF).
    """

    model: str | os.PathLike | None = None
    load_format: str = field(
        default="auto",
        metadata={"help": "weights format; auto: .gguf files as GGUF, folders as safetensors"},
    )
    dtype: str | torch.dtype = field(
        default="auto",
        metadata={"help": "weight and activation dtype; auto: bfloat16 on CUDA, float32 on CPU"},
    )
    device: str = field(default="auto", metadata={"help": "cuda, cpu, or auto (CUDA if present)"})
    max_model_len: int | None = field(
        default=None,
        metadata={"help": "longest prompt + output in tokens (32k works); default: the model's"},
    )
    seed: int = field(default=0, metadata={"help": "seed of random weights and unseeded sampling"})
    tokenizer: str | os.PathLike | None = None
    skip_tokenizer_init: bool = field(
        default=False,
        metadata={
            "help": "load no tokenizer (vLLM's option): prompts are token ids, outputs carry "
            "token ids and empty text; text prompts, chat, stop strings, bad_words, structured "
            "output, tool and reasoning parsers and /tokenize are refused"
        },
    )
    hf_overrides: dict = field(
        default_factory=dict,
        metadata={
            "help": "JSON object merged over the model's config.json, e.g. '{\"rope_theta\": 1e6}'"
        },
    )
    revision: str | None = field(
        default=None, metadata={"help": "Hugging Face Hub branch, tag or commit of the model"}
    )
    generation_config: str = field(
        default="auto",
        metadata={
            "help": "auto: the model's generation_config.json (or GGUF metadata) sets the "
            "sampling defaults of requests (its max_new_tokens: the default max_tokens, and "
            "the most a served request generates); vllm: ladle's defaults; or a folder with "
            "a generation_config.json"
        },
    )
    override_generation_config: dict = field(
        default_factory=dict,
        metadata={
            "help": "JSON object laid over the model's generation config (vLLM's flag), e.g. "
            "'{\"temperature\": 0.5, \"top_p\": 0.9, \"max_new_tokens\": 100}'; keys: "
            "temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens (the "
            "default max_tokens, and the most a request may ask for)"
        },
    )
    download_dir: str | None = field(
        default=None,
        metadata={"help": "folder for downloaded Hub models (default: the Hugging Face cache)"},
    )
    enforce_eager: bool = field(
        default=False,
        metadata={"help": "run every step eagerly: no CUDA graphs of decode steps (CUDA only)"},
    )
    quantization: str = field(
        default="auto",
        metadata={
            "help": "weight quantization: fp8 (CUDA: e4m3 W8A8), int8 (CUDA: W8A8; CPU: int8 x "
            "int8 with per-token activation scales), int4 (weight-only, group 128), gguf (a "
            "GGUF file's Q8_0/Q4_*/Q6_K tensors kept in their own format, CPU), none, or auto (a "
            "quantized checkpoint's own method; for a GGUF on the CPU, unless --dtype is given, "
            "gguf where ladle's C kernels build, else weight-only int8; otherwise none); "
            "vLLM's gptq, gptq_marlin, awq, awq_marlin and compressed-tensors load a checkpoint "
            "of that format as auto does, and refuse a model that is not one"
        },
    )

    max_logprobs: int = field(
        default=LIMITS["logprobs"].high,
        metadata={
            "help": "the most logprobs a request may ask for per token (logprobs / "
            f"top_logprobs), at most {LIMITS['logprobs'].high}"
        },
    )

    def __post_init__(self) -> None:
        # Paths may come as os.PathLike (pathlib.Path, resolve_default_model()'s result); the
        # loaders, the JSON that starts the engine process and the CLI all take text.
        for name in ("model", "tokenizer", "download_dir", "generation_config"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
        if not 0 <= self.max_logprobs <= LIMITS["logprobs"].high:
            raise ValueError(
                f"max_logprobs must be in [0, {LIMITS['logprobs'].high}], got {self.max_logprobs}"
            )
        if self.quantization is None:  # vLLM's default: what the checkpoint says, ladle's auto
            object.__setattr__(self, "quantization", "auto")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization {self.quantization!r} is not one of {', '.join(QUANTIZATIONS)}"
            )
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format {self.load_format!r} is not one of {LOAD_FORMATS}")
        if self.generation_config not in ("auto", "vllm", "ladle"):
            check_generation_config_folder(self.generation_config)
        if self.override_generation_config is None:
            object.__setattr__(self, "override_generation_config", {})
        sampling_overrides(self.override_generation_config)  # a bad key fails at start-up
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if not is_torch_dtype(self.dtype) and self.dtype != "auto":
            if self.dtype not in SUPPORTED_DTYPE_NAMES:
                raise ValueError(
                    f"dtype {self.dtype!r} is not supported; choose one of auto, "
                    f"{', '.join(SUPPORTED_DTYPE_NAMES)}"
                )
