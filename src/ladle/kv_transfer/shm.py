"""Names of the shared-memory KV pools CPU producers export (worker/kv_peers.py), and their
removal once a producer is gone. No torch here: the API process cleans up after a dead engine."""

from __future__ import annotations

import contextlib
import glob
import os

SHM_DIR = "/dev/shm"
SHM_PREFIX = "ladle-kv-"


def pool_path(pid: int, token: str) -> str:
    return os.path.join(SHM_DIR, f"{SHM_PREFIX}{pid}-{token}")


def remove_pool(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def remove_exported_pools(pid: int) -> None:
    """Delete the shared-memory pools a (dead) engine process left behind."""
    for path in glob.glob(os.path.join(SHM_DIR, f"{SHM_PREFIX}{pid}-*")):
        remove_pool(path)
