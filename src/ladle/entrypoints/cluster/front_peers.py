"""The router counters of all front processes, summed, for whichever of them answers /metrics.

With `ladle serve --replicas N --api-server-count K`, K processes serve the endpoint, and each
keeps its own router counters (Ray builds a request router in every process that holds a handle
to the replicas). A scrape lands on one of them, so each process answers its own counters on a
Unix socket in a directory the K share (`front-<index>.sock`: connect, read the Prometheus text
to the end), and the one scraped adds up its own and the others'. A socket that exists is also
how the first process knows another has started serving.

A process that does not answer within PEER_TIMEOUT_S (it died, Ray restarts nothing here: the
first process starts a new one) is left out of that scrape, so the sums can drop, as a restarted
counter does; Prometheus's rate() treats it as a reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

# Through the module: see request_router.py.
from ladle.entrypoints.cluster import routing_metrics
from ladle.entrypoints.cluster.replica_metrics import sum_metrics

logger = logging.getLogger("ladle.cluster")

PEER_TIMEOUT_S = 2.0


def peer_socket_path(directory: str | Path, index: int) -> Path:
    return Path(directory) / f"front-{index}.sock"


class FrontPeers:
    """This front process's place among `count` of them: serves its counters, sums everyone's."""

    def __init__(self, directory: str | Path, index: int, count: int) -> None:
        if not 0 <= index < count:
            raise ValueError(f"front process index must be in [0, {count}), got {index}")
        self.directory = Path(directory)
        self.index = index
        self.count = count
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """Listen on this process's socket (replacing a stale one of a process it replaces)."""
        path = peer_socket_path(self.directory, self.index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._server = await asyncio.start_unix_server(self._answer, path=str(path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(peer_socket_path(self.directory, self.index))

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(routing_metrics.render_routing_metrics())
            await writer.drain()
        finally:
            writer.close()

    async def routing_metrics_text(self) -> bytes:
        """The router counters of every front process that answers, added up."""
        others = [index for index in range(self.count) if index != self.index]
        answers = await asyncio.gather(*(self._ask(index) for index in others))
        own = routing_metrics.render_routing_metrics()
        return sum_metrics([own, *(answer for answer in answers if answer is not None)])

    async def _ask(self, index: int) -> bytes | None:
        path = peer_socket_path(self.directory, index)
        try:
            async with asyncio.timeout(PEER_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(str(path))
                try:
                    return await reader.read()
                finally:
                    writer.close()
        except (OSError, TimeoutError) as error:
            logger.warning("front process %d left out of /metrics: %s", index, error)
            return None
