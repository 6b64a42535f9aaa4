"""A tqdm bar over the tensors a loader streams in, the same for every checkpoint format."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from tqdm.auto import tqdm


def with_progress(
    weights: Iterable[tuple[str, torch.Tensor]], total: int | None, description: str
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `weights` unchanged while a bar counts them on stderr.

    disable=None: shown on a terminal, silent when stderr is a file or a pipe (server logs, CI).
    """
    with tqdm(
        weights, total=total, desc=description, unit="tensor", disable=None, dynamic_ncols=True
    ) as bar:
        yield from bar
