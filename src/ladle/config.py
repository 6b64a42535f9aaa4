"""Engine configuration: frozen dataclasses, their defaults and their validation in one place.

Every user-facing knob (LLM(...) keyword, `ladle serve` flag) maps onto one field here, and every
bad value is rejected at construction with a ValueError that names the field.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ladle.kv_transfer.config import KVTransferConfig
from ladle.sampling.limits import LIMITS
from ladle.spec_decode.vllm_spec_keys import from_vllm_spellings
from ladle.vllm_settled_options import without_settled_options

if TYPE_CHECKING:
    import torch

# torch is imported only where a dtype or device is resolved (in the engine): `ladle serve`'s
# API process builds and validates an EngineConfig but never needs torch, and importing it there
# (1.5-3 s) delays spawning the engine process by as much.
SUPPORTED_DTYPE_NAMES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}


def supported_dtypes() -> dict[str, torch.dtype]:
    """Each accepted dtype spelling and the torch dtype it names."""
    import torch

    return {name: getattr(torch, torch_name) for name, torch_name in SUPPORTED_DTYPE_NAMES.items()}


def _is_torch_dtype(value: object) -> bool:
    # A torch.dtype can only exist once torch is imported; checking so keeps torch unimported.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.dtype)


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
# "auto": the model's dtype. fp8 and fp8_e4m3 are one format (vLLM's spellings).
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
PREEMPTION_MODES = ("auto", "swap", "recompute")


def resolve_device(device: str) -> torch.device:
    """'auto' picks CUDA when present, else the CPU."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for but CUDA is not available")
    return resolved


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """'auto' is bfloat16 on CUDA and float32 on the CPU (where bf16 matmuls are slow, inexact)."""
    import torch

    dtypes = supported_dtypes()
    if isinstance(dtype, torch.dtype):
        if dtype not in dtypes.values():
            raise ValueError(f"dtype {dtype} is not supported; use bfloat16, float16 or float32")
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in dtypes:
        raise ValueError(
            f"dtype {dtype!r} is not supported; choose one of auto, {', '.join(dtypes)}"
        )
    return dtypes[dtype]


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
            "sampling defaults of requests; vllm: ladle's defaults; or a folder with a "
            "generation_config.json"
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
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if not _is_torch_dtype(self.dtype) and self.dtype != "auto":
            if self.dtype not in SUPPORTED_DTYPE_NAMES:
                raise ValueError(
                    f"dtype {self.dtype!r} is not supported; choose one of auto, "
                    f"{', '.join(SUPPORTED_DTYPE_NAMES)}"
                )


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache.

    On CUDA the pool is sized from free memory after a measured peak forward pass, times
    gpu_memory_utilization. On the CPU it is cpu_kv_cache_gib. num_kv_blocks overrides both
    (tests use it to force preemption).
    """

    block_size: int = field(default=16, metadata={"help": "tokens per KV cache block"})
    gpu_memory_utilization: float = field(
        default=0.90, metadata={"help": "fraction of GPU memory for weights, activations and KV"}
    )
    cpu_kv_cache_gib: float = field(
        default=1.0, metadata={"help": "KV cache size on the CPU, in GiB"}
    )
    num_kv_blocks: int | None = field(
        default=None, metadata={"help": "KV cache blocks, overriding the measured size"}
    )
    enable_prefix_caching: bool = field(
        default=True, metadata={"help": "reuse the KV cache of shared prompt prefixes"}
    )
    kv_offloading_size: float | None = field(
        default=None,
        metadata={"help": "GiB of host memory for the KV cache's host tier: full prefix blocks "
                  "are written back there and loaded again when a later prompt needs them "
                  "(0 turns it off; default: on CUDA a share of the free host memory, capped "
                  "at 4 GiB; off on the CPU, whose KV is in host memory already)"},
    )
    kv_cache_dtype: str = field(
        default="auto",
        metadata={"help": "KV cache storage: auto (the model's dtype) or fp8 / fp8_e4m3 (float8 "
                  "e4m3 with per-layer k/v scales from the checkpoint or a start-up "
                  "calibration: about twice the tokens of bf16)"},
    )
    kv_transfer_config: dict | None = field(
        default=None,
        metadata={"help": "prefill/decode disaggregation, as JSON (vLLM's keys): "
                  '\'{"kv_role": "kv_producer"|"kv_consumer"|"kv_both", "kv_connector": '
                  '"LadleConnector"}\' (docs/serving.md; `ladle serve --disaggregate 1P1D` sets '
                  "it up on one machine)"},
    )

    def __post_init__(self) -> None:
        if self.kv_transfer_config is not None:
            self.kv_transfer  # noqa: B018 -- validates now, at start-up
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            is_e5m2 = self.kv_cache_dtype == "fp8_e5m2"
            hint = "; e5m2 is not supported, use fp8_e4m3" if is_e5m2 else ""
            raise ValueError(
                f"kv_cache_dtype {self.kv_cache_dtype!r} is not one of "
                f"{', '.join(KV_CACHE_DTYPES)}{hint}"
            )
        if self.block_size < 1 or self.block_size > 1024:
            raise ValueError(f"block_size must be in [1, 1024], got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.cpu_kv_cache_gib <= 0:
            raise ValueError(f"cpu_kv_cache_gib must be > 0, got {self.cpu_kv_cache_gib}")
        if self.kv_offloading_size is not None and not self.kv_offloading_size >= 0:
            raise ValueError(
                f"kv_offloading_size must be >= 0 GiB (0 turns the host tier off), got "
                f"{self.kv_offloading_size}"
            )
        # Block 0 is the reserved null block, so a usable pool needs at least two.
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2, got {self.num_kv_blocks}")

    @property
    def kv_transfer(self) -> KVTransferConfig | None:
        """The parsed kv_transfer_config; None for an engine that is not disaggregated."""
        if self.kv_transfer_config is None:
            return None
        return KVTransferConfig.from_dict(self.kv_transfer_config)


@dataclass(frozen=True)
class SchedulerConfig:
    """One token budget per step shared by prefill chunks and decodes."""

    max_num_batched_tokens: int = field(
        default=8192, metadata={"help": "token budget of one engine step (prefill + decode)"}
    )
    max_num_seqs: int = field(default=256, metadata={"help": "most sequences running at once"})
    enable_chunked_prefill: bool = field(
        default=True, metadata={"help": "split long prompts over several steps' token budgets"}
    )
    itl_slo_ms: float | None = field(
        default=None,
        metadata={"help": "inter-token latency SLO in ms (or a duration such as 50ms): steps "
                  "beside running decodes take only the prompt tokens that keep the measured "
                  "step time within it (decode-first)"},
    )
    preemption_mode: str = field(
        default="auto",
        metadata={"help": "what a preempted request's KV becomes: swap (its full blocks come "
                  "back from the KV cache's host tier), recompute (computed again), or auto "
                  "(per request, whichever the measured copy bandwidth and prefill rate say is "
                  "faster; recompute without a host tier)"},
    )
    async_scheduling: bool | None = field(
        default=None,
        metadata={"help": "overlapped scheduling: build and launch each step while the device "
                  "runs the one before (default: on for CUDA, off on the CPU)"},
    )
    speculative_config: dict | None = field(
        default=None,
        metadata={"help": "speculative decoding, as JSON (vLLM's keys): "
                  '\'{"method": "ngram"|"suffix"|"draft_model"|"eagle"|"eagle3"|"auto", '
                  '"num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5, '
                  '"model": DRAFT_MODEL_OR_HEAD}\''},
    )

    def overlaps_on(self, device_type: str) -> bool:
        """Whether steps overlap (engine/overlap.py): the user's choice, else on CUDA only (on
        the CPU the host computes the step itself: there is nothing to overlap with)."""
        if self.async_scheduling is not None:
            return self.async_scheduling
        return device_type == "cuda"

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.itl_slo_ms is not None and not self.itl_slo_ms > 0:
            raise ValueError(f"itl_slo_ms must be > 0, got {self.itl_slo_ms}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode must be one of {', '.join(PREEMPTION_MODES)}, got "
                f"{self.preemption_mode!r}"
            )
        if self.speculative_config is not None:
            self.speculative  # noqa: B018 -- validates now, at start-up

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """The parsed speculative_config; None when speculation is off."""
        if self.speculative_config is None:
            return None
        return SpeculativeConfig.from_dict(self.speculative_config)


SPECULATIVE_METHODS = ("ngram", "suffix", "draft_model", "eagle", "eagle3", "auto")
# Methods whose drafts a network computes in the worker (`model` names it); auto uses one when
# `model` is given.
MODEL_DRAFT_METHODS = ("draft_model", "eagle", "eagle3")
# vLLM's other methods: named so their users get "not yet supported", not "unknown".
SPECULATIVE_METHODS_LATER = ("mtp", "medusa")
MAX_SPECULATIVE_TOKENS = 16
# `model` for an EAGLE-3 head of random weights in the target's shape (benchmarks on dummy
# weights only: --load-format dummy).
RANDOM_DRAFT_HEAD = "random"


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (vLLM's --speculative-config keys): a proposer drafts up to
    num_speculative_tokens tokens per request per step, and the step verifies them.

    method: ngram (prompt lookup), suffix (suffix matching over the request and earlier
    outputs), draft_model (a smaller model of the same tokenizer, `model`), eagle / eagle3 (an
    EAGLE-1 / EAGLE-3 head in vLLM's checkpoint layout, `model`), or auto (per request, suffix
    drafts or the `model`'s, whichever measures better; suffix alone without `model`).
    prompt_lookup_min/max: the n-gram lengths ngram matches (and the shortest match suffix
    trusts). suffix_max_cached_requests: earlier requests' outputs the suffix index keeps.
    model: the draft model or head (folder, preset name with --load-format dummy; for eagle3
    also "random": a random head of the target's shape, dummy weights only). adaptive: choose
    each request's draft length per step from its measured acceptance and the step's cost
    (spec_decode/adaptive.py); off: always the longest draft the proposer has.
    synthetic_acceptance (benchmarks only): the verifier accepts each draft with this
    probability instead of checking it, so outputs are NOT the model's.
    drafts_on_device: with ngram and overlapped scheduling, make the drafts on the device so a
    drafted request's next step is planned while its verify step runs (engine/overlap.py).
    Off by default until it is measured on a GPU (on the CPU it costs ~75 small ops a drafted
    step); false: host drafts, and drafted requests' steps are synchronous.
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    suffix_max_cached_requests: int = 1000
    model: str | None = None
    adaptive: bool = True
    synthetic_acceptance: float | None = None
    drafts_on_device: bool = False

    def __post_init__(self) -> None:
        if self.method in SPECULATIVE_METHODS_LATER:
            raise ValueError(
                f"speculative_config.method={self.method!r} is not yet supported by ladle; "
                f"supported: {', '.join(SPECULATIVE_METHODS)}"
            )
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_config.method must be one of {', '.join(SPECULATIVE_METHODS)}, "
                f"got {self.method!r}"
            )
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"speculative_config.num_speculative_tokens must be an integer in "
                f"1..{MAX_SPECULATIVE_TOKENS}, got {k!r}"
            )
        for name in ("prompt_lookup_min", "prompt_lookup_max", "suffix_max_cached_requests"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"speculative_config.{name} must be an integer >= 1, got {value!r}"
                )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculative_config.prompt_lookup_min ({self.prompt_lookup_min}) is above "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        self._check_model()
        for name in ("adaptive", "drafts_on_device"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"speculative_config.{name} must be true or false, "
                    f"got {getattr(self, name)!r}"
                )
        rate = self.synthetic_acceptance
        if rate is not None and (
            isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1
        ):
            raise ValueError(
                f"speculative_config.synthetic_acceptance must be a number in [0, 1], got {rate!r}"
            )

    def _check_model(self) -> None:
        model = self.model
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise ValueError(
                f"speculative_config.model must be a path or preset name, got {model!r}"
            )
        if self.method in MODEL_DRAFT_METHODS and model is None:
            raise ValueError(
                f"speculative_config.model is required for method {self.method!r} (the draft "
                "model's or head's folder)"
            )
        if self.method in ("ngram", "suffix") and model is not None:
            raise ValueError(
                f"speculative_config.model is not used by method {self.method!r} (model-free "
                "drafts); use draft_model, eagle, eagle3 or auto"
            )
        if model == RANDOM_DRAFT_HEAD and self.method not in ("eagle3", "auto"):
            raise ValueError(
                f"speculative_config.model={RANDOM_DRAFT_HEAD!r} (a random EAGLE-3 head) needs "
                f"method eagle3 or auto, got {self.method!r}"
            )

    @property
    def uses_model_drafts(self) -> bool:
        """Whether a network drafts in the worker (its drafts come back with each step)."""
        return self.method in MODEL_DRAFT_METHODS or (
            self.method == "auto" and self.model is not None
        )

    @classmethod
    def from_dict(cls, options: dict) -> SpeculativeConfig:
        """Build from the user's dict (JSON), naming any key ladle does not know; vLLM's
        spellings (no `method`, `draft_tensor_parallel_size`) first become ladle's."""
        if not isinstance(options, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {options!r}")
        options = from_vllm_spellings(options)
        method = options.get("method")
        if method in SPECULATIVE_METHODS_LATER:
            # Before the keys: such a config carries keys ladle does not know yet, and the
            # method is what the user needs to hear about.
            raise ValueError(
                f"speculative_config.method={method!r} is not yet supported by ladle; "
                f"supported: {', '.join(SPECULATIVE_METHODS)}"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"speculative_config: unknown key(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(sorted(known))}"
            )
        if "method" not in options:
            raise ValueError(
                f"speculative_config.method is required ({', '.join(SPECULATIVE_METHODS)})"
            )
        return cls(**options)


EXECUTOR_BACKENDS = ("uni", "mp", "ray")
# distributed/expert_dispatch.py implements the forms ("auto" times them at start-up).
DISPATCH_MODES = ("auto", "allreduce", "alltoall")


@dataclass(frozen=True)
class ParallelConfig:
    """How the model is spread over devices and processes (vLLM's names). One worker process
    per rank; tensor and pipeline parallelism run today, and the issues that add data and expert
    parallelism lift those limits."""

    tensor_parallel_size: int = field(
        default=1, metadata={"help": "GPUs each layer is split over (tensor parallelism)"}
    )
    pipeline_parallel_size: int = field(
        default=1, metadata={"help": "stages the layers are split into (pipeline parallelism)"}
    )
    data_parallel_size: int = field(
        default=1, metadata={"help": "engine replicas in data parallel (one today)"}
    )
    enable_expert_parallel: bool = field(
        default=False, metadata={"help": "spread a mixture of experts' experts over the ranks"}
    )
    disable_custom_all_reduce: bool = field(
        default=False,
        metadata={"help": "keep NCCL for every tensor-parallel all-reduce (by default small ones "
                  "take a one-shot all-reduce over symmetric memory where start-up measures it "
                  "faster, on CUDA)"},
    )
    expert_parallel_dispatch: str = field(
        default="auto",
        metadata={"help": "how expert parallelism moves tokens to their experts' ranks: "
                  "'allreduce' (every rank runs its experts on every token, one all-reduce), "
                  "'alltoall' (tokens sent to their experts' ranks and back, then an "
                  "all-gather) or 'auto' (timed at start-up, chosen per step size)"},
    )
    distributed_executor_backend: str | None = field(
        default=None,
        metadata={"help": "how workers run: 'uni' (in the engine process), 'mp' (one process "
                  "per rank) or 'ray' (one Ray actor per rank, on any host of a Ray cluster); "
                  "default 'uni' for one rank, 'mp' for several"},
    )

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.data_parallel_size > 1:
            raise ValueError(
                f"data_parallel_size={self.data_parallel_size}: data parallelism inside one "
                "engine is not implemented; run replicas (ladle serve --replicas N)"
            )
        if self.expert_parallel_dispatch not in DISPATCH_MODES:
            raise ValueError(
                f"expert_parallel_dispatch must be one of {', '.join(DISPATCH_MODES)}, got "
                f"{self.expert_parallel_dispatch!r}"
            )
        backend = self.distributed_executor_backend
        if backend is not None and backend not in EXECUTOR_BACKENDS:
            raise ValueError(
                f"distributed_executor_backend must be one of {', '.join(EXECUTOR_BACKENDS)}, "
                f"got {backend!r}"
            )
        if backend == "uni" and self.world_size > 1:
            raise ValueError(
                "distributed_executor_backend='uni' runs one rank in the engine process; "
                f"{self.world_size} ranks (tensor_parallel_size={self.tensor_parallel_size}, "
                f"pipeline_parallel_size={self.pipeline_parallel_size}) need 'mp' (one process "
                "per rank)"
            )

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def executor_backend(self) -> str:
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "mp" if self.world_size > 1 else "uni"


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
                if key in {f.name for f in dataclasses.fields(config_class)}:
                    sections[section][key] = value
                    break
            else:
                raise ValueError(f"unknown engine option {key!r}")
        return cls(
            model=ModelConfig(**sections["model"]),
            cache=CacheConfig(**sections["cache"]),
            scheduler=SchedulerConfig(**sections["scheduler"]),
            parallel=ParallelConfig(**sections["parallel"]),
        )
