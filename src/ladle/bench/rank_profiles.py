"""`ladle bench --profile-ranks`: each rank profiles a window of its own steps
(worker/step_profiler.py, switched on through the environment before the workers start) and the
bench reports, per rank, the wall and kernel-busy time of a step and the time in collectives.
Under tensor or pipeline parallelism the ranks live in their own processes, where a profiler
around the bench cannot see them."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

DEFAULT_WINDOW = "100:50"


def switch_on(window: str) -> Path:
    """Ask every rank started after this call to profile steps SKIP:COUNT; their folder."""
    # Imported here: `ladle serve`'s parser reads DEFAULT_WINDOW and must not import torch.
    from ladle.worker.step_profiler import DIRECTORY_ENV, WINDOW_ENV

    directory = Path(tempfile.mkdtemp(prefix="ladle-rank-profiles-"))
    os.environ[DIRECTORY_ENV] = str(directory)
    os.environ[WINDOW_ENV] = window
    return directory


def read(directory: Path, world_size: int) -> list[dict | None]:
    """Each rank's summary; None for a rank whose window was not reached (too few steps)."""
    summaries: list[dict | None] = []
    for rank in range(world_size):
        path = directory / f"rank{rank}.json"
        summaries.append(json.loads(path.read_text()) if path.exists() else None)
    return summaries


def table_rows(summaries: list[dict | None]) -> list[tuple[str, str]]:
    rows = []
    for rank, summary in enumerate(summaries):
        if summary is None:
            rows.append((f"rank {rank} profile", "window not reached (raise the run's steps)"))
            continue
        rows.append((
            f"rank {rank} step wall/busy/collectives (ms)",
            f"{summary['wall_ms_per_step']:.3f}/{summary['kernel_busy_ms_per_step']:.3f}/"
            f"{summary['collective_ms_per_step']:.3f}",
        ))  # fmt: skip
        computing = summary.get("compute_busy_fraction")
        if computing is not None:  # CUDA: the share of the wall its non-collective kernels run
            rows.append((f"rank {rank} computing (busy fraction)", f"{computing:.3f}"))
    return rows
