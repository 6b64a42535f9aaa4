"""vLLM engine options whose value, as scripts and command lines usually pass it, is what ladle
does anyway: accepted with that value (so `LLM(model, trust_remote_code=True)` and
`ladle serve MODEL --trust-remote-code` run), refused naming the option with any value ladle
does not honour. They hold no state: nothing reads them after this check.

    options = without_settled_options({"trust_remote_code": True, "max_num_seqs": 8})
    # {"max_num_seqs": 8}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SettledOption:
    """accepts(value): whether ladle already does what that value asks; why: what ladle does."""

    accepts: Callable[[object], bool]
    why: str


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


SETTLED_OPTIONS: dict[str, SettledOption] = {
    "trust_remote_code": SettledOption(
        _is_bool,
        "ladle runs its own implementation of each architecture it supports and never imports "
        "a checkpoint's Python code, so either value loads the same model",
    ),
    # vLLM's LLM turns its stats off by default (get_metrics() then needs False); ladle's
    # counters cost nothing and are always kept.
    "disable_log_stats": SettledOption(
        _is_bool, "ladle's LLM always keeps its counters (LLM.get_metrics())"
    ),
    # vLLM's default; with --kv-offloading-size it names how KV reaches host memory.
    "kv_offloading_backend": SettledOption(
        lambda value: value == "native",
        "ladle's host tier is vLLM's native CPU offloading ('native'); LMCache is not there",
    ),
    "tokenizer_mode": SettledOption(
        lambda value: value in ("auto", "hf"),
        "ladle uses the model's Hugging Face (fast) tokenizer: 'auto' or 'hf'",
    ),
}


def without_settled_options(options: dict) -> dict:
    """`options` less the settled ones; a settled option with a value ladle does not honour is
    a ValueError naming it."""
    kept = {}
    for name, value in options.items():
        settled = SETTLED_OPTIONS.get(name)
        if settled is None:
            kept[name] = value
        elif not settled.accepts(value):
            raise ValueError(f"{name}={value!r} is not supported: {settled.why}")
    return kept
