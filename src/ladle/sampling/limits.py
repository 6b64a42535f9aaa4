"""The one table of numeric limits a request's fields must meet, and the checks built from it.

Every bound here is a range the engine can represent and use: the sampler packs top_k, seeds
and token ids into int32 rows, the IPC layer (msgspec) carries int64 at most, and a float that
is NaN or infinite would poison a whole batch's logits. `SamplingParams` (ValueError, offline)
and the server's request models (400 naming the field) are both generated from `LIMITS`, so a
new field is one new row, and the two front ends can never disagree.

The check that needs the model (top_k within the vocabulary) is `check_top_k`, which the engine
core runs on every request it is given (prompt token ids are checked against the vocabulary
there too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Limit:
    """A closed (or half-open) numeric range for one field.

    kind: "int" (bools are not ints here) or "float" (ints accepted; must be finite).
    low_exclusive: the field must be strictly greater than low.
    disabled: one extra value outside the range that means "off" (top_k = -1).
    """

    name: str
    kind: str
    low: float
    high: float
    low_exclusive: bool = False
    disabled: int | None = None

    def describe(self) -> str:
        """The rule, as the error message states it ("must be in [1, 128]")."""
        opening = "(" if self.low_exclusive else "["
        span = f"{opening}{_show(self.low)}, {_show(self.high)}]"
        kind = "an integer" if self.kind == "int" else "a finite number"
        if self.disabled is not None:
            return f"must be {self.disabled} (disabled) or {kind} in {span}"
        return f"must be {kind} in {span}"

    def accepts(self, value: object) -> bool:
        if self.kind == "int":
            if not _is_int(value):
                return False
            if self.disabled is not None and value == self.disabled:
                return True
        elif not _is_finite_number(value):
            return False
        above_low = value > self.low if self.low_exclusive else value >= self.low
        return above_low and value <= self.high

    def check(self, value: object) -> None:
        """Raise ValueError("<name> must be ..., got <value>") unless the value is allowed."""
        if not self.accepts(value):
            raise ValueError(f"{self.name} {self.describe()}, got {_shorten(value)}")


# Token ids and token counts are int32 in the engine's tensors; seeds and priorities cross the
# IPC layer as int64. The sampling ranges are vLLM's (penalties as OpenAI documents them).
LIMITS: dict[str, Limit] = {
    limit.name: limit
    for limit in (
        Limit("n", "int", 1, 128),
        Limit("temperature", "float", 0.0, 1e6),
        Limit("top_p", "float", 0.0, 1.0, low_exclusive=True),
        Limit("top_k", "int", 0, INT32_MAX, disabled=-1),
        Limit("min_p", "float", 0.0, 1.0),
        Limit("presence_penalty", "float", -2.0, 2.0),
        Limit("frequency_penalty", "float", -2.0, 2.0),
        Limit("repetition_penalty", "float", 0.0, 10.0, low_exclusive=True),
        Limit("seed", "int", INT64_MIN, INT64_MAX),
        Limit("max_tokens", "int", 1, INT32_MAX),
        Limit("min_tokens", "int", 0, INT32_MAX),
        Limit("logprobs", "int", 0, 20),
        Limit("stop_token_ids", "int", 0, INT32_MAX),  # each element
        Limit("priority", "int", INT64_MIN, INT64_MAX),
        Limit("best_of", "int", 1, 128),
    )
}


def check_field(name: str, value: object) -> None:
    """ValueError naming the field unless value meets its row (None means "not given")."""
    if value is None:
        return
    LIMITS[name].check(value)


def check_top_k(top_k: int, vocab_size: int) -> None:
    """The rule that needs the model: top_k at most the vocabulary size (or -1)."""
    if top_k > vocab_size:
        raise ValueError(
            f"top_k must be -1 (disabled) or at most the vocabulary size {vocab_size}, "
            f"got {top_k}"
        )


# ----- the server's request models -----------------------------------------------------------


def api_field(name: str) -> Any:
    """A pydantic type for the request field that follows row `name`: strict JSON type, then the
    row's range; a violation is a 400 whose message is the row's rule."""
    from pydantic import AfterValidator, StrictFloat, StrictInt
    from pydantic_core import PydanticCustomError

    limit = LIMITS[name]

    def validate(value: Any) -> Any:
        if not limit.accepts(value):
            raise PydanticCustomError(
                "out_of_range", "{rule}, got {value}",
                {"rule": limit.describe(), "value": _shorten(value)},
            )
        return value

    base = StrictInt if limit.kind == "int" else StrictFloat | StrictInt
    return Annotated[base, AfterValidator(validate)]


# ----- helpers ---------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _show(bound: float) -> str:
    return repr(bound)


def _shorten(value: object) -> str:
    """repr, cut short: a 10 000-digit integer should not fill the error message."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
