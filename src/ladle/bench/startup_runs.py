"""One measured start-up of `ladle bench startup`: a fresh Python process, timed from before its
spawn to the first generated token, as a user meets it.

Offline: `python -m ladle.bench.startup_child` builds LLM(...) and generates one token; the clock
stops when its result line is read. Serve: `python -m ladle serve` on a free port; /health is
polled until it answers 200, then one streamed completion of one token is sent; the clock stops
at the first streamed chunk that carries a choice. Either way the child's stderr is kept, and the
engine's start-up phases line in it (startup_phases.py) says where the seconds went.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ladle.bench.startup_child import RESULT_PREFIX
from ladle.startup_phases import parse_startup_phases

# Polling /health this often adds at most this much to a serve measurement.
HEALTH_POLL_S = 0.05


class StartupRunError(RuntimeError):
    """The child exited, or timed out, before its first token; the message ends with its
    stderr's tail."""


@dataclass
class StartupRun:
    """One start-up, process spawn to first token (seconds on the parent's clock)."""

    total_s: float
    first_token_ids: list[int] = field(default_factory=list)
    first_text: str = ""
    ready_s: float | None = None  # serve: /health answered 200
    child: dict = field(default_factory=dict)  # offline: the child's own clock
    phases: dict[str, float] = field(default_factory=dict)  # the engine's start-up phases
    # The engine's warm-up line on CUDA: steps, graphs captured, Triton builds and disk hits.
    warmup_report: str = ""

    def as_dict(self) -> dict:
        return {
            "total_s": self.total_s,
            "ready_s": self.ready_s,
            "first_token_ids": self.first_token_ids,
            "first_text": self.first_text,
            "child": self.child,
            "phases": self.phases,
            "warmup_report": self.warmup_report,
        }


WARMUP_PREFIX = "[ladle] warm-up: "


def _warmup_report(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith(WARMUP_PREFIX)]
    return lines[-1][len("[ladle] ") :] if lines else ""


def _stderr_tail(path: Path, num_lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
    except OSError:
        return ""


def run_offline_once(
    model: str | None,
    engine_flags: list[str],
    prompt_token_ids: list[int],
    env: dict[str, str],
    timeout_s: float,
) -> StartupRun:
    """One offline start-up: LLM(...) then generate of one token, in a fresh process."""
    command = [sys.executable, "-m", "ladle.bench.startup_child"]
    command += [model] if model else []
    command += ["--prompt-token-ids", ",".join(map(str, prompt_token_ids)), *engine_flags]
    with tempfile.TemporaryDirectory(prefix="ladle-startup-") as folder:
        stderr_path = Path(folder) / "stderr.txt"
        with open(stderr_path, "w") as stderr:
            started = time.perf_counter()
            child = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=stderr, env=env, text=True
            )
            result = None
            try:
                assert child.stdout is not None
                # A hung child blocks readline: the timer kills it, which ends the read.
                timer = _kill_after(child, timeout_s)
                for line in child.stdout:
                    if line.startswith(RESULT_PREFIX):
                        total = time.perf_counter() - started
                        result = json.loads(line[len(RESULT_PREFIX) :])
                        break
                timer.cancel()
                child.wait(timeout=60)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
        if result is None:
            raise StartupRunError(
                f"the offline child exited with status {child.returncode} before its first "
                f"token:\n{_stderr_tail(stderr_path)}"
            )
        log = stderr_path.read_text(errors="replace")
    return StartupRun(
        total_s=total,
        first_token_ids=result["first_token_ids"],
        first_text=result["first_text"],
        child=result,
        phases=parse_startup_phases(log),
        warmup_report=_warmup_report(log),
    )


def _kill_after(child: subprocess.Popen, timeout_s: float):
    timer = threading.Timer(timeout_s, child.kill)
    timer.daemon = True
    timer.start()
    return timer


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_serve_once(
    model: str | None,
    engine_flags: list[str],
    prompt_token_ids: list[int],
    env: dict[str, str],
    timeout_s: float,
) -> StartupRun:
    """One `ladle serve` start-up: spawn, poll /health, stream one token."""
    port = free_port()
    command = [sys.executable, "-m", "ladle", "serve"]
    command += [model] if model else []
    command += ["--host", "127.0.0.1", "--port", str(port), *engine_flags]
    base_url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="ladle-startup-") as folder:
        stderr_path = Path(folder) / "stderr.txt"
        with open(stderr_path, "w") as log:
            started = time.perf_counter()
            # Its own session: the server's engine-core process is stopped with it.
            server = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            try:
                ready = _wait_healthy(server, base_url, started + timeout_s) - started
                first_text = _first_streamed_text(base_url, prompt_token_ids, timeout_s)
                total = time.perf_counter() - started
            except StartupRunError as error:
                raise StartupRunError(f"{error}:\n{_stderr_tail(stderr_path)}") from None
            finally:
                _stop(server)
        log = stderr_path.read_text(errors="replace")
    return StartupRun(
        total_s=total,
        first_text=first_text,
        ready_s=ready,
        phases=parse_startup_phases(log),
        warmup_report=_warmup_report(log),
    )


def _wait_healthy(server: subprocess.Popen, base_url: str, deadline: float) -> float:
    while time.perf_counter() < deadline:
        if server.poll() is not None:
            raise StartupRunError(f"the server exited with status {server.returncode}")
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=5) as response:
                if response.status == 200:
                    return time.perf_counter()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(HEALTH_POLL_S)
    raise StartupRunError("the server did not answer /health in time")


def _first_streamed_text(base_url: str, prompt_token_ids: list[int], timeout_s: float) -> str:
    body = {
        "prompt": prompt_token_ids,
        "max_tokens": 1,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    request = urllib.request.Request(
        base_url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[len("data:") :]).get("choices") or []
                if choices:
                    return choices[0].get("text", "")
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
        raise StartupRunError(f"the streamed completion failed: {error}") from None
    raise StartupRunError("the stream ended without a token")


def _stop(server: subprocess.Popen) -> None:
    """SIGINT to the server's process group (it shuts its engine down), then SIGKILL."""
    if server.poll() is not None:
        return
    try:
        os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=20)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait()
