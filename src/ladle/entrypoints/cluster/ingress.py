"""LadleIngress: the endpoint as a Ray Serve deployment, behind Ray Serve's HTTP proxy, for
applications deployed with `serve run` / `serve deploy` (app.py's build_app).

It is ReplicaFront (front.py) in a Serve replica: /health and /metrics answered there, every
other request sent to a replica's own HTTP server, its response relayed as bytes. (`ladle serve
--replicas N` runs the same front in its own process instead, without the proxy's hop.)
"""

# No `from __future__ import annotations`: FastAPI reads the route methods' annotations at
# runtime, and serve.ingress re-binds them out of this module's namespace.

from fastapi import FastAPI, Request
from fastapi.responses import Response
from ray import serve
from ray.serve.handle import DeploymentHandle

from ladle.entrypoints.cluster.front import FrontSettings, ReplicaFront, num_running_replicas

ingress_app = FastAPI(title="ladle", docs_url=None, redoc_url=None, openapi_url=None)

# Everything the class below calls is defined above it: serve.ingress builds a new class at
# decoration time, which Ray pickles by value together with the globals it finds then.


def _num_running_replicas() -> int:
    return num_running_replicas(serve.get_replica_context().app_name)


@serve.ingress(ingress_app)
class LadleIngress:
    """Ray Serve deployment body of the endpoint; `engine` is the LadleReplica deployment."""

    def __init__(self, engine: DeploymentHandle, settings: FrontSettings) -> None:
        self._front = ReplicaFront(engine, settings, _num_running_replicas)

    @ingress_app.get("/health")
    async def health(self) -> Response:
        return await self._front.health()

    @ingress_app.get("/metrics")
    async def metrics(self) -> Response:
        return await self._front.metrics()

    @ingress_app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def forward(self, request: Request, path: str) -> Response:
        return await self._front.forward(request)
