"""The GPU suite runs as four pytest workers sharing one GPU (`-n 4 --dist loadfile`). torch's
caching allocator keeps every block a worker ever freed, so a kernel test that allocated tens of
GiB left them held, and another worker's engine then ran out of memory in its prefill (seen once
in session 9: 67 GiB held by one worker). Each test hands its cached blocks back when it ends,
and each file also collects the cycles that still hold tensors (an engine and its graphs)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch


def _return_cached_blocks() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def _release_gpu_memory_after_each_test() -> Iterator[None]:
    yield
    _return_cached_blocks()


@pytest.fixture(autouse=True, scope="module")
def _collect_after_each_file() -> Iterator[None]:
    yield
    gc.collect()
    _return_cached_blocks()
