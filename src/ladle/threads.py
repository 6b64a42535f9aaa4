"""CPU thread settings of ladle's processes, so a busy machine slows ladle in proportion to
the CPU it loses, not 10-30x.

Why it collapsed: torch runs each large op as an OpenMP parallel region over one thread per
core, and every region ends at a barrier. When other processes want the same cores, one of the
team's threads is often descheduled; the others then wait at the barrier for a scheduler time
slice (milliseconds), hundreds of times per decode step. By default libgomp's waiting threads
also spin, taking CPU from the very thread they wait for. Three settings fix it:

1. The OpenMP wait policy is PASSIVE (a waiting thread sleeps at once), set in the environment
   before torch loads: by `import ladle` for the offline API when torch is not imported yet, and
   inherited by the engine-core process, which imports torch only after it starts. A user's
   own OMP_WAIT_POLICY wins.
2. The engine's intra-op thread count follows the machine: all usable cores while nothing
   else wants them, fewer while other runnable threads compete (ThreadGovernor, checked between
   steps from the kernel's count of runnable threads, /proc/loadavg). A team no larger than the
   free cores never waits at a barrier for a thread that is not running.
3. The API process of `ladle serve` does HTTP and tokenization, not tensor math: one torch
   thread, so it never keeps an OpenMP team of its own next to the engine's.

OMP_NUM_THREADS (or torch.set_num_threads before ladle starts) caps the count as usual.
"""

from __future__ import annotations

import os
import sys
import time

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
# How often the governor looks at the machine; a look costs one read of /proc/loadavg.
CHECK_INTERVAL_S = 0.25
# The competitor count is smoothed over a few looks, so a process that runs for a moment (a
# compiler, a shell command) does not shrink the team for long.
SMOOTHING = 0.5


def prefer_passive_waiting() -> bool:
    """Make OpenMP threads sleep instead of spinning when they wait, unless the user chose.
    Takes effect only if torch (and its OpenMP runtime) is not loaded yet; True if it will."""
    os.environ.setdefault(WAIT_POLICY_ENV, "PASSIVE")
    return "torch" not in sys.modules


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers and taskset set)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def runnable_threads() -> int | None:
    """Threads runnable on the whole machine right now, this one included; None if unknown."""
    try:
        with open("/proc/loadavg") as file:
            return int(file.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def configure_api_process_threads() -> None:
    """The API process computes no tensors: one torch thread, no spare OpenMP team, if torch is
    loaded here at all. Call it again once the tokenizer is loaded (which may import torch).

    It never imports torch itself: that would delay spawning the engine process by torch's
    import time (1.5-3 s), and a process that never loads torch has no OpenMP team to size."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


class ThreadGovernor:
    """Sizes torch's intra-op team between engine steps to the cores other work leaves free.

    max_threads: the most it will use (default: torch's current count, which OMP_NUM_THREADS
    or the user's torch.set_num_threads set). A machine with one core, or a read of
    /proc/loadavg that fails, leaves the count alone.
    """

    def __init__(self, max_threads: int | None = None) -> None:
        import torch

        self._torch = torch
        self.max_threads = max(1, min(max_threads or torch.get_num_threads(), usable_cores()))
        self.num_threads = torch.get_num_threads()
        self.enabled = self.max_threads > 1 and runnable_threads() is not None
        # Our own OpenMP workers spin while they wait unless the policy is passive; spinning,
        # they count as runnable and must not be mistaken for competitors.
        self._workers_spin = os.environ.get(WAIT_POLICY_ENV, "").upper() != "PASSIVE"
        self._competitors = 0.0
        self._last_check = 0.0
        if self.enabled:
            self._set(self.max_threads)

    def maybe_adjust(self) -> None:
        """Call between steps (not inside one); cheap when called more often than needed."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last_check < CHECK_INTERVAL_S:
            return
        self._last_check = now
        running = runnable_threads()
        if running is None:
            return
        ours = 1 + (self.num_threads - 1 if self._workers_spin else 0)
        competitors = max(0, running - ours)
        self._competitors = SMOOTHING * self._competitors + (1 - SMOOTHING) * competitors
        free_cores = usable_cores() - round(self._competitors)
        wanted = max(1, min(self.max_threads, free_cores))
        if wanted != self.num_threads:
            self._set(wanted)

    def _set(self, num_threads: int) -> None:
        self._torch.set_num_threads(num_threads)
        self.num_threads = num_threads
