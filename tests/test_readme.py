"""Every code block of the README runs as written: the Python ones as they are, the shell ones
against a server on a free port (for `localhost:8000`) and, for `make`, as a dry run (CI runs
the real `make test`; `make run` is the server the curl block talks to)."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_blocks(language: str) -> list[str]:
    return [code for lang, code in BLOCK.findall(README.read_text()) if lang == language]


def test_the_readme_has_the_blocks_these_tests_run():
    assert readme_blocks("python") and readme_blocks("bash")
    assert {lang for lang, _ in BLOCK.findall(README.read_text())} <= {"python", "bash"}


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(readme_blocks("python"))))
def test_python_block_runs(index, tmp_path):
    code = readme_blocks("python")[index]
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("index", range(len(readme_blocks("python"))))
def test_python_blocks_use_every_name_they_assign(index):
    """A reader copies the example to see its results: a result assigned and never printed or
    used (the chat example's `replies`, issue 32) shows nothing."""
    tree = ast.parse(readme_blocks("python")[index])
    assigned = {
        target.id
        for node in ast.walk(tree) if isinstance(node, ast.Assign)
        for target in node.targets if isinstance(target, ast.Name)
    }
    used = {
        node.id for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    assert assigned <= used, f"assigned and never used: {sorted(assigned - used)}"


def _shell_lines(block: str) -> list[str]:
    """The block's commands, continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        command = line.split("  #", 1)[0].strip()
        if command and not command.startswith("#"):
            commands.append(command)
    return commands


def test_make_targets_in_the_readme_exist():
    root = README.parent
    for block in readme_blocks("bash"):
        for command in _shell_lines(block):
            if command.startswith("make "):
                argv = shlex.split(command)
                result = subprocess.run(
                    ["make", "-n", *argv[1:]],
                    cwd=root,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert result.returncode == 0, f"{command}: {result.stderr}"


@pytest.mark.slow
def test_curl_blocks_answer_from_the_default_model():
    from tests.entrypoints.server_process import ServerProcess

    curls = [c for b in readme_blocks("bash") for c in _shell_lines(b) if c.startswith("curl ")]
    assert curls
    with ServerProcess(["--max-num-seqs", "4"]) as server:
        for command in curls:
            command = command.replace("localhost:8000", f"127.0.0.1:{server.port}")
            result = subprocess.run(
                ["bash", "-c", command + " --fail-with-body"],
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert result.returncode == 0, result.stdout + result.stderr
            assert '"choices"' in result.stdout
