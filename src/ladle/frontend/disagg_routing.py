"""When an xPyD front splits a prompt (prefill engine, then decode engine) and when it runs it
whole on the least loaded engine, as an aggregated replica would (`--disaggregate-min-prompt`).

Splitting pays by keeping prompt work out of the steps of running streams: a prompt run whole
on an engine that is decoding stalls each of its streams for about the prompt's prefill time.
Where that stall is small, the split buys nothing and costs a GPU that only prefills and a KV
copy, so two aggregated engines serve more. The fixed form is a token line (TOKENS); `auto`
derives the line from measurements: a prompt runs whole when its prefill time at the engine's
measured prompt rate (prompt tokens per second of the steps that computed some; the prefill
engine's until the whole-run engine has measured its own) fits the inter-token budget
(`--itl-slo`, else 50 ms). Before any measurement every prompt is split.
"""

from __future__ import annotations

from dataclasses import dataclass

from ladle.protocol.messages import SchedulerStats

AUTO = "auto"
# The stall a whole-run prompt may add to running streams' inter-token time without --itl-slo.
DEFAULT_ITL_BUDGET_S = 0.05


@dataclass(frozen=True)
class SplitPolicy:
    """min_prompt_tokens: the fixed line (0: split every prompt); itl_budget_s: set for
    `auto`, the stall a whole-run prompt may cost running streams."""

    min_prompt_tokens: int = 0
    itl_budget_s: float | None = None

    @classmethod
    def parse(cls, value: int | str, itl_slo_ms: float | None = None) -> SplitPolicy:
        """--disaggregate-min-prompt TOKENS | auto (a ValueError names the flag)."""
        if isinstance(value, str) and value.strip().lower() == AUTO:
            budget = itl_slo_ms / 1000 if itl_slo_ms else DEFAULT_ITL_BUDGET_S
            return cls(itl_budget_s=budget)
        try:
            tokens = int(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"--disaggregate-min-prompt takes a token count or 'auto', got {value!r}"
            ) from None
        if tokens < 0:
            raise ValueError(f"--disaggregate-min-prompt must be >= 0, got {tokens}")
        return cls(min_prompt_tokens=tokens)

    @property
    def is_auto(self) -> bool:
        return self.itl_budget_s is not None

    def line(self, whole: SchedulerStats | None, prefill: SchedulerStats | None) -> int:
        """Prompts of at least this many tokens are split."""
        if self.itl_budget_s is None:
            return self.min_prompt_tokens
        rate = whole.prefill_tokens_per_s if whole is not None else 0.0
        if rate <= 0 and prefill is not None:
            rate = prefill.prefill_tokens_per_s
        if rate <= 0:
            return 0  # nothing measured yet: split
        return max(1, int(rate * self.itl_budget_s))
