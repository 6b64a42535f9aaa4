"""What a worker keeps of each request it runs: filled from the StepPlan, never read from the
scheduler.

A request arrives in full once (protocol.step.NewRequest) and is forgotten when a plan names it
finished or preempted (a resumed request arrives in full again). Its tokens grow as the worker
reads its own steps' results (ModelRunner's LaunchedStep.result), so a prompt chunk's input ids,
the penalties' first rows, bad_words and prompt logprobs all read the worker's copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ladle.protocol.step import NewRequest
from ladle.sampling.params import SamplingParams


@dataclass
class RequestState:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    sampling_seed: int
    eos_token_ids: tuple[int, ...]
    output_token_ids: list[int] = field(default_factory=list)
    # prompt + outputs: a step's input ids are a slice of it.
    all_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_new(cls, new: NewRequest) -> RequestState:
        return cls(
            request_id=new.request_id,
            prompt_token_ids=list(new.prompt_token_ids),
            sampling_params=new.sampling_params,
            sampling_seed=new.sampling_seed,
            eos_token_ids=tuple(new.eos_token_ids),
            output_token_ids=list(new.output_token_ids),
            all_token_ids=[*new.prompt_token_ids, *new.output_token_ids],
        )


class RequestStates:
    """The requests a worker runs, by id."""

    def __init__(self) -> None:
        self._states: dict[str, RequestState] = {}

    def add(self, new_requests: list[NewRequest]) -> None:
        """Take new requests; one the worker already holds is replaced (a fault-isolation
        probe and the re-run send the same plan twice)."""
        for new in new_requests:
            self._states[new.request_id] = RequestState.from_new(new)

    def forget(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._states.pop(request_id, None)

    def __getitem__(self, request_id: str) -> RequestState:
        return self._states[request_id]

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._states

    def __len__(self) -> int:
        return len(self._states)

    def append_tokens(self, request_id: str, token_ids: list[int]) -> None:
        """Record a step's accepted tokens (unknown ids: forgotten while the step ran)."""
        state = self._states.get(request_id)
        if state is not None:
            state.output_token_ids.extend(token_ids)
            state.all_token_ids.extend(token_ids)
