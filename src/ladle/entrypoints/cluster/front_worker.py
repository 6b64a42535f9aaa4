"""One more front process of `ladle serve --replicas N --api-server-count K` (front_processes.py):
`python -m ladle.entrypoints.cluster.front_worker`, started by the first front process with
FrontProcessSpec as JSON on stdin. It binds the endpoint's port (SO_REUSEPORT, beside the other
front processes' sockets), joins the running Ray cluster as a driver, serves the endpoint, and
stops on SIGTERM or when the first front process is gone.
"""

from __future__ import annotations

import os
import sys

import ray

from ladle.entrypoints.cluster.front_processes import FrontProcessSpec, serve_front_process
from ladle.entrypoints.cluster.front_server import bind_socket


def main() -> int:
    spec, index = FrontProcessSpec.from_json(sys.stdin.read())
    parent_pid = os.getppid()
    # Its own logs only: the replicas' lines already reach the first process's output.
    ray.init(address=spec.ray_address, include_dashboard=False, log_to_driver=False)
    # Bound only now, ready to serve: from its bind on, the kernel hands this socket its share
    # of new connections, which would wait out the seconds of joining Ray.
    listener = bind_socket(spec.host, spec.port, reuse_port=True)
    try:
        served = serve_front_process(listener, spec, index, lambda: None, parent_pid=parent_pid)
    finally:
        ray.shutdown()
    return 0 if served else 1


if __name__ == "__main__":
    sys.exit(main())
