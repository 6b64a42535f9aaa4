"""Whether speculation pays at the current load, decided by measuring it.

A step with drafts costs more than one without: more tokens to verify, and a drafted request's
step is synchronous (its proposer reads the tokens its last step produced), so the host's work
per step is no longer hidden behind the device's. What that costs depends on the model, the
GPU, the host and the batch; modelled from step timings it was wrong where it mattered (H200,
S1 through `ladle serve`, synthetic acceptance 0.6: 0.56x of no speculation at 128 in flight on
the 0.6B shape; at batch 1 the 8B shape never drafted after one slow step). So the governor
measures the outcome instead: per load level (running requests, in power-of-two buckets) it
runs epochs of EPOCH_STEPS steps with speculation on or off, keeps a moving average of the
output tokens per second of each, and runs the better one, trying the other again after
EXPLORE_EVERY epochs (so a level whose answer changes is noticed). Each retry that confirms the
answer doubles the wait before the next, up to MAX_EXPLORE_EVERY, so where speculation never pays
its cost falls from 1/16 of the epochs towards 1/256; a retry that finds the answer changed
starts the waits over.

A level seen for the first time with no neighbour measured starts drafting up to
MAX_LEVEL_FIRST_ON running requests (a short run, e.g. vLLM's offline example, then drafts at
once) and with plain steps above it: there a drafted epoch where speculation loses can take
twice as long (the 8B shape's first epoch at 256 running, S1 served, H200, session 49: 43.8
against 87.4 tok/s per request), while a plain one where it wins only forgoes the gain for one
epoch. Otherwise it starts from what its neighbours measured: speculation pays less
the more requests share a step, so if it lost at a lighter load it starts off here, and if it won
at a heavier load it starts on; the other mode waits for the first exploration. Without that,
every new level paid one epoch in each mode first, and a batch that drains from 256 requests
visits each level once and briefly (S1 at 256 in flight on the 0.6B shape, H200: 18% of the
request-steps drafted, 0.949x of no speculation overall; with the hints, 0.957x).

While more prompt tokens wait than one step computes (a burst of arrivals) no step speculates:
a drafted step's verify tokens come out of the prefills' budget, and every waiting request's
first token comes later. S1 at 256 in flight on the 8B shape (H200) lost 10% to drafting in its
ramp-up, at levels where steady decoding had measured it a win.

The rate compared is per running request (output tokens per second over the epoch's mean running
count). A level spans a factor of two in requests, and a batch draining through it measures one
mode at the top of that range and the other further down: compared as whole-batch rates, the mode
measured first won by the batch it happened to have (up to 2x), not by what it did. A request's
own rate varies far less across the range while steps are not compute-bound.

Speculation runs only where it measured at least WIN_MARGIN faster than plain steps; a closer
result is a tie and ties go to plain steps, the mode that cannot lose. At 128 and 256 in flight
on the 0.6B shape (S1 served, H200, session 49) the two modes' epochs measured within a few
percent of each other, on a batch whose per-request rate drifted up as it drained; a tie then
went to speculation (the mode explored last, on the drift) and lost 6% and 8% overall.

When a level's answer changes (first measured, or flipped by an exploration) the governor says so
through its `report` callable: one line, so an operator can see where speculation is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

EPOCH_STEPS = 16  # steps of one measurement (engine steps, drafted or not)
MIN_EPOCH_STEPS = 4  # an epoch cut short by a change of load level counts from this many
EXPLORE_EVERY = 16  # epochs in the better mode before the worse one is tried again (at first)
MAX_EXPLORE_EVERY = 256
SMOOTHING = 0.5  # weight of the newest epoch in a mode's average rate
WIN_MARGIN = 0.05  # how much faster speculation must measure to run
# A level with no neighbour measured starts drafting up to this many running requests, above it
# with plain steps (module docstring).
MAX_LEVEL_FIRST_ON = 16


def load_level(num_running: int) -> int:
    """The power-of-two bucket of a running count (1, 2, 4, 8, ...; 0 for none)."""
    return 0 if num_running <= 0 else 1 << (num_running - 1).bit_length()


@dataclass
class _Level:
    rate_on: float | None = None  # output tokens per second per running request, moving average
    rate_off: float | None = None
    num_epochs: int = 0
    explore_every: int = EXPLORE_EVERY
    epochs_since_explore: int = 0
    # The mode the neighbouring levels' measurements point to (None: no hint); it runs first and
    # the other waits for an exploration.
    prior: bool | None = None
    # Without a hint: the mode of the first epoch, the other's follows at once.
    first_mode: bool = True

    def better_mode(self) -> bool | None:
        if self.rate_on is None or self.rate_off is None:
            return None
        return self.rate_on >= self.rate_off * (1 + WIN_MARGIN)

    def next_mode(self) -> bool:
        """True: speculate in the next epoch."""
        if self.rate_on is None or self.rate_off is None:
            measured = self.rate_on is not None or self.rate_off is not None
            hinted = self.prior if self.prior is not None else self.first_mode
            if measured and self.epochs_since_explore >= self.explore_every:
                return self.rate_on is None  # the unmeasured mode's first epoch
            if not measured or self.prior is not None:
                return hinted
            return self.rate_on is None
        better = self.better_mode()
        return better != (self.epochs_since_explore >= self.explore_every)

    def record(self, speculating: bool, rate: float) -> None:
        was_better = self.better_mode()
        name = "rate_on" if speculating else "rate_off"
        previous = getattr(self, name)
        setattr(self, name, rate if previous is None else previous + SMOOTHING * (rate - previous))
        self.num_epochs += 1
        if was_better is None and self.better_mode() is not None and self.prior is not None:
            # The hinted level's first exploration: the waits run from here.
            self.epochs_since_explore = 0
            return
        if was_better is None or speculating == was_better:
            self.epochs_since_explore += 1
            return
        # An exploration epoch: if the answer held, wait twice as long before the next one.
        self.epochs_since_explore = 0
        if self.better_mode() == was_better:
            self.explore_every = min(2 * self.explore_every, MAX_EXPLORE_EVERY)
        else:
            self.explore_every = EXPLORE_EVERY


@dataclass
class _Tally:
    """Steps of an epoch: their seconds, output tokens and running requests summed."""

    steps: int = 0
    seconds: float = 0.0
    tokens: int = 0
    request_steps: int = 0

    def add(self, seconds: float, tokens: int, num_running: int) -> None:
        self.steps += 1
        self.seconds += seconds
        self.tokens += tokens
        self.request_steps += num_running

    def rate_per_request(self) -> float | None:
        if self.steps < MIN_EPOCH_STEPS or self.seconds <= 0 or self.request_steps <= 0:
            return None
        return self.tokens / self.seconds / (self.request_steps / self.steps)


class SpeculationGovernor:
    """Per load level, speculation on or off by the measured output rate of each.

    The engine calls begin_step(running requests, now) before each step is scheduled and
    observe_outputs(tokens, with_prompt) once per step it launched: the tokens that came back
    meanwhile, and whether that step computed prompt tokens. speculating says what the step does.

    A step with prompt tokens is slow for a reason that is not the mode, and so is the step after
    it (with overlapped scheduling the host waits there for the prompt step's device work): an
    epoch with enough other steps to measure (MIN_EPOCH_STEPS) is measured on those alone. At
    one request in flight each request's prefill falls in some epoch, and the moving average
    carried it for several; where prompts arrive every step, as under heavy load, the epoch is
    measured whole, in both modes alike."""

    def __init__(
        self,
        report: Callable[[str], None] | None = None,
        trace: Callable[[dict], None] | None = None,
    ) -> None:
        """report: each change of a level's answer, as a line. trace: each ended epoch, as a
        record (level, mode, its steps and those measured, the rate recorded; for studying the
        governor, engine_core's LADLE_SPEC_GOVERNOR_TRACE)."""
        self.levels: dict[int, _Level] = {}
        self.speculating = True
        self.report = report
        self.trace = trace
        self._level = -1
        self._epoch_steps = 0  # steps begun in this epoch
        self._all = _Tally()  # the epoch's closed steps
        self._decodes = _Tally()  # those without prompt tokens
        # The step in progress: when it began, its running count, its tokens, prompt or not.
        self._step_start: float | None = None
        self._step_running = 0
        self._step_tokens = 0
        self._step_with_prompt = False
        self._previous_with_prompt = False

    def begin_step(self, num_running: int, now: float, prefill_backlog: bool = False) -> bool:
        """Whether the step about to be scheduled speculates. prefill_backlog: more prompt
        tokens wait than one step computes; the step then does not speculate and is not
        measured."""
        self._close_step(now)
        if prefill_backlog:
            self._step_start = None
            return False
        level = load_level(num_running)
        if level != self._level or self._epoch_steps >= EPOCH_STEPS:
            self._end_epoch()
            self._level = level
            if level not in self.levels:
                self.levels[level] = _Level(
                    prior=self._neighbours_hint(level), first_mode=level <= MAX_LEVEL_FIRST_ON
                )
            self.speculating = self.levels[level].next_mode()
        self._epoch_steps += 1
        self._step_start = now
        self._step_running = num_running
        return self.speculating

    def went_idle(self) -> None:
        """No request is left: the step in progress would be timed across the pause until
        the next request (seconds, for a benchmark's probe request before its run)."""
        self._step_start = None

    def _close_step(self, now: float) -> None:
        if self._step_start is not None:
            seconds = now - self._step_start
            self._all.add(seconds, self._step_tokens, self._step_running)
            # With overlapped scheduling a step's time is mostly its predecessor's device work
            # (the host waits for that step's tokens): the step after a prompt step carries it.
            if not (self._step_with_prompt or self._previous_with_prompt):
                self._decodes.add(seconds, self._step_tokens, self._step_running)
        self._previous_with_prompt = self._step_with_prompt
        self._step_tokens = 0
        self._step_with_prompt = False

    def _neighbours_hint(self, level: int) -> bool | None:
        """Off if speculation lost at some lighter load, on if it won at some heavier one."""
        answers = {other: state.better_mode() for other, state in self.levels.items()}
        if any(answer is False for other, answer in answers.items() if other < level):
            return False
        if any(answer is True for other, answer in answers.items() if other > level):
            return True
        return None

    def observe_outputs(self, num_tokens: int, with_prompt: bool = False) -> None:
        """The step launched last came with num_tokens new tokens (its predecessors'), and
        computed prompt tokens if with_prompt."""
        self._step_tokens += num_tokens
        self._step_with_prompt |= with_prompt

    def _end_epoch(self) -> None:
        rate = self._decodes.rate_per_request()
        if rate is None:
            rate = self._all.rate_per_request()
        if self.trace is not None and self._all.steps:
            self.trace(
                {
                    "level": self._level,
                    "speculating": self.speculating,
                    "steps": self._all.steps,
                    "seconds": self._all.seconds,
                    "tokens": self._all.tokens,
                    "request_steps": self._all.request_steps,
                    "decode_steps": self._decodes.steps,
                    "decode_seconds": self._decodes.seconds,
                    "decode_tokens": self._decodes.tokens,
                    "rate": rate if self._level > 0 else None,
                }
            )
        if self._level > 0 and rate is not None:
            state = self.levels[self._level]
            answer = state.better_mode()
            state.record(self.speculating, rate)
            if self.report is not None and state.better_mode() != answer:
                self.report(self._describe_level(self._level, state))
        self._epoch_steps = 0
        self._all = _Tally()
        self._decodes = _Tally()

    @staticmethod
    def _describe_level(level: int, state: _Level) -> str:
        mode = "on" if state.better_mode() else "off"
        return (
            f"speculation {mode} at <= {level} running: on {state.rate_on:,.1f} / "
            f"off {state.rate_off:,.1f} tok/s per request"
        )

    def describe(self) -> str:
        """Each measured level: the two rates (per request) and the mode that wins."""
        return "; ".join(
            self._describe_level(level, state)
            for level, state in sorted(self.levels.items())
            if state.better_mode() is not None
        )
