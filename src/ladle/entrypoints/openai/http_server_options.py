"""HttpServerOptions: `ladle serve`'s flags for its HTTP server (uvicorn), in one place for the
two servers that take them: one `ladle serve`'s API server, and each front process of
`ladle serve --replicas N` (which gets them as JSON: plain data)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

import uvicorn

from ladle.entrypoints.openai.http_protocol import make_fastest_timed_protocol


@dataclasses.dataclass(frozen=True)
class HttpServerOptions:
    log_level: str = "info"
    access_log: bool = False
    shutdown_timeout_s: float = 30.0  # in-flight requests' time to finish on SIGTERM
    request_timeout_s: float = 60.0  # a request's headers and body, else 408
    keep_alive_timeout_s: float = 5.0
    max_connections: int | None = 1024  # per server process; beyond it, 503
    # HTTPS (vLLM's --ssl-keyfile, --ssl-certfile, --ssl-ca-certs): uvicorn's own TLS.
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None

    def __post_init__(self) -> None:
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ValueError("--ssl-keyfile and --ssl-certfile go together: give both or none")
        for flag, path in (
            ("--ssl-keyfile", self.ssl_keyfile),
            ("--ssl-certfile", self.ssl_certfile),
            ("--ssl-ca-certs", self.ssl_ca_certs),
        ):
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"{flag} {path!r} is not a file")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> HttpServerOptions:
        return cls(
            log_level=args.log_level,
            # vLLM's --disable-uvicorn-access-log: the access log is off unless --access-log.
            access_log=args.access_log and not args.disable_uvicorn_access_log,
            shutdown_timeout_s=args.shutdown_timeout,
            request_timeout_s=args.request_timeout,
            keep_alive_timeout_s=args.keep_alive_timeout,
            max_connections=args.max_connections,
            ssl_keyfile=args.ssl_keyfile,
            ssl_certfile=args.ssl_certfile,
            ssl_ca_certs=args.ssl_ca_certs,
        )

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_certfile else "http"

    def uvicorn_config(self, app: Any, **extra: Any) -> uvicorn.Config:
        """uvicorn's config for `app` with these options (extra: host, port, ...); httptools'
        protocol when installed, with the request deadline either way (http_protocol.py)."""
        return uvicorn.Config(
            app,
            log_level=self.log_level,
            access_log=self.access_log,
            timeout_graceful_shutdown=self.shutdown_timeout_s,
            lifespan="on",
            http=make_fastest_timed_protocol(self.request_timeout_s),
            timeout_keep_alive=self.keep_alive_timeout_s,
            limit_concurrency=self.max_connections,
            ssl_keyfile=self.ssl_keyfile,
            ssl_certfile=self.ssl_certfile,
            ssl_ca_certs=self.ssl_ca_certs,
            **extra,
        )
