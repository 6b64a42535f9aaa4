"""Kernel tests under Triton's interpreter on the CPU.

Triton decides interpreted or compiled when it (and each kernel) is imported, and the engine
imports it at start-up, so such a test file runs itself again in a child pytest started with
TRITON_INTERPRET=1: its kernel tests (`interpreted`) run only there, and one parent test
(`parent_only`) starts the child and asserts that it passed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
interpreted = pytest.mark.skipif(not IN_INTERPRETER, reason="runs in the interpreter child")
parent_only = pytest.mark.skipif(IN_INTERPRETER, reason="this is the child")


def run_in_interpreter_child(test_file: str, timeout: int = 600) -> None:
    """Run the test file `test_file` in a child pytest under the interpreter; fail with the
    end of its output unless every test it ran passed."""
    root = Path(test_file).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1")
    paths = [str(root / "src"), str(root / "tests"), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", "-x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.strip().splitlines()[-1]
