"""The endpoint of `ladle serve --replicas N` in K processes (`--api-server-count K`), because one
Python process relaying every replica's tokens tops out at about one core (docs/benchmarks.md,
"Issue 13: the front on more than one core").

The first front process is the `ladle serve` process itself: it starts Ray, deploys the replicas,
binds the port with SO_REUSEPORT and then starts K-1 more front processes (front_worker.py) that
bind it too, each its own socket: the kernel spreads new connections over them by a hash of the
connection's addresses (Linux only, hence K > 1 only there). Each process joins the same Ray
cluster as a driver of its own, with its own handle to the replicas and so its own request
router:

- prefix routing agrees across them: a prefix's owner is a hash of the prefix among the replicas
  within the load margin (prefix_routing.py), the same in every process;
- the load each router counts is the requests it sent itself, so each process balances its own
  share; with connections spread evenly, each share is about 1/K of every replica's queue, and
  the spill margin applies to that share (K x the margin in all, at most);
- the router counters in /metrics are summed over the processes (front_peers.py); the replicas'
  metrics are asked once, by the process that answers the scrape; /health asks Ray, as before;
- faults are handled per request as before, in whichever process holds it; a front process that
  dies is started again by the first one, and the others stop when the first one is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from ray import serve

from ladle.entrypoints.cluster.front import (
    ENGINE_DEPLOYMENT_NAME,
    FrontSettings,
    ReplicaFront,
    num_running_replicas,
)
from ladle.entrypoints.cluster.front_peers import FrontPeers, peer_socket_path
from ladle.entrypoints.cluster.front_server import FrontServer, build_front_app
from ladle.entrypoints.openai.http_server_options import HttpServerOptions

logger = logging.getLogger("ladle.cluster")

# Importing ladle and ray and joining the cluster as a driver takes a few seconds; on a loaded
# machine, many more.
START_TIMEOUT_S = 120.0
WORKER_COMMAND = [sys.executable, "-m", "ladle.entrypoints.cluster.front_worker"]
# A front process that keeps dying is started again at most this often.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 300.0


def can_share_a_port() -> bool:
    """SO_REUSEPORT spreading connections over the sockets bound to one port: Linux's."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def default_api_server_count(num_replicas: int, num_cpus: int | None = None) -> int:
    """One front process per replica (each relays about one replica's tokens at full speed),
    at most a quarter of the machine's cores: every replica also runs an engine-core process and
    its own API process (~2 cores), which the fronts must not starve. One where processes cannot
    share a port."""
    if not can_share_a_port():
        return 1
    num_cpus = num_cpus or os.cpu_count() or 1
    return max(1, min(num_replicas, num_cpus // 4))


@dataclasses.dataclass(frozen=True)
class FrontProcessSpec:
    """What every front process needs to serve the endpoint; JSON on another one's stdin."""

    ray_address: str
    app_name: str
    host: str  # the port every front process binds (SO_REUSEPORT)
    port: int
    count: int
    peers_dir: str
    settings: FrontSettings
    options: HttpServerOptions

    def to_json(self, index: int) -> str:
        return json.dumps({"index": index, **dataclasses.asdict(self)})

    @staticmethod
    def from_json(text: str) -> tuple[FrontProcessSpec, int]:
        """(spec, this process's index)."""
        fields = json.loads(text)
        index = fields.pop("index")
        fields["settings"] = FrontSettings(**fields["settings"])
        fields["options"] = HttpServerOptions(**fields["options"])
        return FrontProcessSpec(**fields), index


def serve_front_process(
    listener: socket.socket,
    spec: FrontProcessSpec,
    index: int,
    on_started: Callable[[], None],
    workers: FrontWorkers | None = None,
    parent_pid: int | None = None,
) -> bool:
    """ReplicaFront under uvicorn on `listener` until SIGTERM / Ctrl-C (or, in another front
    process, until the first one is gone); True if it served. Ray must be initialised."""
    engine = serve.get_deployment_handle(ENGINE_DEPLOYMENT_NAME, spec.app_name)
    peers = FrontPeers(spec.peers_dir, index, spec.count) if spec.count > 1 else None
    extra: dict[str, Any] = (
        {} if peers is None else {"routing_metrics_text": peers.routing_metrics_text}
    )
    front = ReplicaFront(
        engine, spec.settings, lambda: num_running_replicas(spec.app_name), **extra
    )
    server = FrontServer(
        spec.options.uvicorn_config(build_front_app(front)), on_started, peers, workers, parent_pid
    )
    try:
        server.run(sockets=[listener])
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the Ctrl-C it handled once it has drained
    return server.started and not server.start_failed


def find_front_workers(root_pid: int) -> list[Any]:
    """The front processes after the first, under the `ladle serve` process root_pid (psutil
    processes; for benchmarks and tests, which watch them from outside)."""
    import psutil  # a test dependency only (the `test` extra): benchmarks and tests call this

    workers = []
    for child in psutil.Process(root_pid).children(recursive=True):
        try:
            if "front_worker" in " ".join(child.cmdline()):
                workers.append(child)
        except psutil.Error:  # exited while we looked
            continue
    return workers


class FrontWorkers:
    """The front processes after the first: started, watched, restarted, stopped by it."""

    def __init__(self, spec: FrontProcessSpec) -> None:
        self._spec = spec
        self._processes: dict[int, subprocess.Popen] = {}
        self._restarts: dict[int, list[float]] = {}  # index -> when it was started again
        self._given_up: set[int] = set()
        self._stopping = False

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self._processes.values()]

    def start(self) -> None:
        for index in range(1, self._spec.count):
            self._spawn(index)

    def _spawn(self, index: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            peer_socket_path(self._spec.peers_dir, index).unlink()  # its readiness mark
        process = subprocess.Popen(WORKER_COMMAND, stdin=subprocess.PIPE, text=True)
        process.stdin.write(self._spec.to_json(index))
        process.stdin.close()
        self._processes[index] = process

    async def wait_serving(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Returns once every other front process serves; raises RuntimeError when one exits
        first or they take longer than timeout_s."""
        deadline = time.monotonic() + timeout_s
        for index, process in self._processes.items():
            while not peer_socket_path(self._spec.peers_dir, index).exists():
                if process.poll() is not None:
                    raise RuntimeError(
                        f"front process {index} exited with {process.returncode} before serving"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"front process {index} not serving after {timeout_s:g}s")
                await asyncio.sleep(0.1)

    def restart_dead(self) -> None:
        """Starts again each front process that exited, unless it already was MAX_RESTARTS
        times within RESTART_WINDOW_S (then it stays down: something else is wrong, and the
        others serve on)."""
        now = time.monotonic()
        for index, process in list(self._processes.items()):
            if process.poll() is None or self._stopping or index in self._given_up:
                continue
            recent = [t for t in self._restarts.get(index, []) if now - t < RESTART_WINDOW_S]
            if len(recent) >= MAX_RESTARTS:
                self._given_up.add(index)
                logger.error(
                    "front process %d exited %d times within %gs; not starting it again",
                    index,
                    len(recent) + 1,
                    RESTART_WINDOW_S,
                )
                continue
            logger.warning(
                "front process %d (pid %d) exited with %s; starting it again",
                index,
                process.pid,
                process.returncode,
            )
            self._restarts[index] = [*recent, now]
            self._spawn(index)

    def stop(self) -> None:
        """SIGTERM to each: it stops accepting and drains its requests (--shutdown-timeout)."""
        self._stopping = True
        for process in self._processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)

    def wait_stopped(self) -> None:
        grace_s = self._spec.options.shutdown_timeout_s + 10.0
        for process in self._processes.values():
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
