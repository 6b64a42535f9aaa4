"""A real `ladle serve` in a subprocess on 127.0.0.1 (port 0, so the OS picks a free one), and
small helpers to read its /metrics and to watch processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Self

import httpx

SERVING_LINE = re.compile(r"\[ladle\] serving .* on (https?)://127\.0\.0\.1:(\d+)")
ENGINE_LINE = re.compile(r"\[ladle\] engine core (?:running|restarted) in process (\d+)")


class ServerProcess:
    """`python -m ladle.cli serve ARGS...`; start() returns once /health answers 200."""

    def __init__(
        self,
        args: list[str],
        api_key: str | None = None,
        new_session: bool = False,
        verify: object = True,
    ) -> None:
        """new_session: the server leads a process group of its own, which a test may signal
        as a supervisor does (os.killpg) without signalling pytest. verify: httpx's, for a
        server on HTTPS (the CA file that signed its certificate)."""
        self.args = args
        self.api_key = api_key
        self.new_session = new_session
        self.verify = verify
        self.scheme = "http"
        self._reader: threading.Thread | None = None
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.engine_pid: int | None = None
        self._lines: list[str] = []
        self._announced = threading.Event()

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return "".join(self._lines)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def openai_client(self, timeout: float = 60):
        """The official openai client on this server's /v1, with its key, no retries (a test
        sees the first answer)."""
        import openai

        return openai.OpenAI(
            base_url=f"{self.base_url}/v1", api_key=self.api_key or "none", max_retries=0,
            timeout=timeout,
        )

    def start(self, timeout_s: float = 180.0) -> ServerProcess:
        command = [sys.executable, "-m", "ladle.cli", "serve", *self.args, "--port", "0"]
        if self.api_key:
            command += ["--api-key", self.api_key]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=self.new_session,
        )
        self._reader = threading.Thread(target=self._read_output, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout_s
        while not self._announced.wait(0.1):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server did not start:\n{self.log()}")
        while time.monotonic() < deadline:
            try:
                health = httpx.get(f"{self.base_url}/health", timeout=5, verify=self.verify)
                if health.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server never became healthy:\n{self.log()}")

    def _read_output(self) -> None:
        for line in self.process.stdout:
            self._lines.append(line)
            if match := ENGINE_LINE.search(line):
                self.engine_pid = int(match.group(1))
            if match := SERVING_LINE.search(line):
                self.scheme, self.port = match.group(1), int(match.group(2))
                self._announced.set()

    def wait_for_output_end(self, timeout_s: float) -> bool:
        """True once every process holding the server's output (its children too, such as
        multiprocessing's resource tracker, which warns of leaks as it exits) has closed it."""
        self._reader.join(timeout_s)
        return not self._reader.is_alive()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after timeout_s; returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def process_is_running(pid: int) -> bool:
    """False once the process has exited (a zombie waiting to be reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def process_exists(pid: int) -> bool:
    """True while the process or its unreaped zombie exists."""
    return os.path.exists(f"/proc/{pid}")


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def parse_metrics(text: str) -> dict[str, float]:
    """{metric name: value summed over its label sets}, from the Prometheus text format."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_and_labels, _, value = line.rpartition(" ")
        name = name_and_labels.split("{", 1)[0]
        values[name] = values.get(name, 0.0) + float(value)
    return values


def read_metrics(server: ServerProcess) -> dict[str, float]:
    response = httpx.get(f"{server.base_url}/metrics", timeout=10)
    response.raise_for_status()
    return parse_metrics(response.text)


def engine_is_idle(server: ServerProcess) -> bool:
    metrics = read_metrics(server)
    return (
        metrics["vllm:num_requests_running"] == 0
        and metrics["vllm:num_requests_waiting"] == 0
        and metrics["vllm:kv_cache_usage_perc"] == 0
    )
