"""Which engine of an xPyD deployment takes a request: the least loaded of those that can.

Load is the number of sequences routed to an engine now (their outputs come from it): a
prompt in its prefill counts on its prefill engine, a handed-off stream on its decode engine.
The API process knows this exactly and at once, unlike the engines' stats, which arrive a step
late; a burst of requests therefore spreads over the engines even before any of them ran.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Protocol

PREFILL, DECODE = "prefill", "decode"


class Instance(Protocol):
    """What picking reads of an engine instance (frontend/engine_instance.py)."""

    kind: str
    role: str

    @property
    def is_alive(self) -> bool: ...


def instance_loads(engines: Iterable[Instance]) -> Counter:
    """Sequences per engine (keyed by id(engine)), from the engine each route points at."""
    return Counter(id(engine) for engine in engines)


def least_loaded(candidates: Iterable[Instance], loads: Counter) -> Instance | None:
    """The live candidate with the fewest sequences; None when none is alive. Ties go to a
    decode engine (its running streams gain a prompt's stall anyway when it decodes alone, and
    the prefill engines stay free for the prompts that are split), then to the lower index."""
    live = [(index, engine) for index, engine in enumerate(candidates) if engine.is_alive]
    if not live:
        return None
    _, engine = min(live, key=lambda item: (loads[id(item[1])], item[1].kind != DECODE,
                                            item[0]))
    return engine


def role_name(index: int, num_prefill: int) -> tuple[str, str]:
    """Instance index -> (kind, role): instances 0..x-1 prefill, x.. decode; the role carries
    the index, which on CUDA is the instance's GPU ("prefill 0", "decode 1")."""
    kind = PREFILL if index < num_prefill else DECODE
    return kind, f"{kind} {index}"
