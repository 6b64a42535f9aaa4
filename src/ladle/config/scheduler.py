"""SchedulerConfig: one token budget per step, and what the scheduler may do with it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ladle.config.speculative import SpeculativeConfig

PREEMPTION_MODES = ("auto", "swap", "recompute")


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
