"""`ladle serve --replicas N [--ray-address ADDR]`: the same server, as N engine replicas on Ray
Serve behind one endpoint (app.py).

Without --ray-address it starts a private local Ray (no dashboard), deploys the replicas with no
Ray HTTP proxy, serves the endpoint from this process (front_server.py: replica bytes relayed
straight to the client) and stops Ray on exit. With one it joins that cluster and deploys the
whole application there, behind Ray Serve's proxy (build_app), deleting only it on exit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from typing import Any

from ladle.entrypoints.openai.http_server_options import HttpServerOptions

RAY_MISSING = (
    "--replicas and --ray-address run ladle on Ray Serve, which is not installed; "
    "install it with: pip install 'ladle[ray]'  (or: pip install 'ray[serve]')"
)
APP_NAME = "ladle"


def run_cluster(
    args: argparse.Namespace, model: str | None, served_name: str, engine_options: dict[str, Any]
) -> int:
    try:
        # Ray is optional (the `ray` extra) and costs ~0.3 s to import: only cluster serving
        # loads it, not `ladle serve --help` nor a single-process server.
        import ray
        from ray import serve
    except ImportError:
        raise ValueError(RAY_MISSING) from None
    # These import Ray at module level (see above).
    from ladle.entrypoints.cluster.app import build_app, build_replicas
    from ladle.entrypoints.cluster.front_server import bind_socket

    if args.replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {args.replicas}")
    num_fronts = api_server_count(args)  # a bad count fails here, before Ray starts
    autoscaling_config = _autoscaling_config(args, engine_options)
    options = dict(
        num_replicas=args.replicas,
        autoscaling_config=autoscaling_config,
        served_model_name=served_name,
        api_key=args.api_key or None,
        max_request_bytes=args.max_request_bytes,
        allow_unknown_fields=getattr(args, "allow_unknown_fields", False),
        max_queued_requests=args.max_queued_requests,
        max_queued_tokens=args.max_queued_tokens,
        ttft_slo=args.ttft_slo,
        stats_interval=args.stats_interval,
        log_requests=not args.disable_log_requests,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        response_role=getattr(args, "response_role", "assistant"),
        return_tokens_as_token_ids=getattr(args, "return_tokens_as_token_ids", False),
        shutdown_timeout=args.shutdown_timeout,
        routing=args.routing,
        **engine_options,
    )
    replicas = (
        f"{args.replicas}-{args.max_replicas} replicas, autoscaling"
        if autoscaling_config
        else f"{args.replicas} replicas"
    )
    if args.ray_address:
        if getattr(args, "api_server_count", None) not in (None, 1):
            raise ValueError(
                "--api-server-count runs the local front in several processes; with "
                "--ray-address the endpoint is Ray Serve's proxy on the cluster"
            )
        # A shared cluster: Ray Serve's proxy on the cluster is the endpoint (build_app), and
        # the replicas' servers listen on their nodes' addresses.
        app = build_app(model, **options)
        ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=True)
        return _serve_on_cluster(app, args, served_name, replicas)
    # Local: the replicas' servers on loopback, the front in this process.
    replica_app, front_settings = build_replicas(model, replica_http_host="127.0.0.1", **options)
    # Enough logical CPUs for every replica even on a small machine: the replicas mostly wait on
    # their engine-core processes, which Ray does not count.
    ray.init(
        num_cpus=max(os.cpu_count() or 1, args.replicas + 1),
        include_dashboard=False,
        log_to_driver=True,
    )
    try:
        # Fails before any replica starts.
        listener = bind_socket(args.host, args.port, reuse_port=num_fronts > 1)
        serve.start(http_options={"location": "NoServer"})
        serve.run(replica_app, name=APP_NAME, route_prefix=None, blocking=False)
        return serve_front_with_flags(listener, front_settings, args, served_name, replicas)
    except Exception as error:  # a replica that cannot start: one clear line, then clean up
        print(f"ladle: error: the Ray Serve deployment failed: {error}", file=sys.stderr)
        return 1
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def serve_front_with_flags(
    listener: socket.socket,
    front_settings: Any,
    args: argparse.Namespace,
    served_name: str,
    replicas: str,
) -> int:
    """The front (front_server.py) in --api-server-count processes until SIGTERM / Ctrl-C."""
    options = HttpServerOptions.from_args(args)
    count = api_server_count(args)
    port = listener.getsockname()[1]
    shown = f"[{args.host}]" if ":" in args.host else args.host
    fronts = f", {count} front processes" if count > 1 else ""

    def announce() -> None:
        print(
            f"[ladle] serving {served_name} ({replicas} on Ray Serve{fronts}) on "
            f"http://{shown}:{port} (OpenAI API under /v1; ready: GET /health -> 200)",
            flush=True,
        )

    return serve_front(listener, front_settings, options, count, announce)


def api_server_count(args: argparse.Namespace) -> int:
    """--api-server-count, or its default for the replicas asked (the most, when autoscaling)."""
    # front_processes imports Ray at module level (optional, ~0.3 s to import).
    from ladle.entrypoints.cluster.front_processes import (
        can_share_a_port,
        default_api_server_count,
    )

    count = getattr(args, "api_server_count", None)
    if count is None:
        return default_api_server_count(max(args.replicas, args.max_replicas or 0))
    if count < 1:
        raise ValueError(f"--api-server-count must be >= 1, got {count}")
    if count > 1 and not can_share_a_port():
        raise ValueError("--api-server-count > 1 needs Linux (SO_REUSEPORT)")
    return count


def serve_front(
    listener: socket.socket,
    front_settings: Any,
    options: Any,
    count: int,
    announce: Any,
) -> int:
    """The front in `count` processes on `listener`'s port (this one and count-1 started here,
    which bind it too: `listener` must have SO_REUSEPORT when count > 1), for the replicas of
    application APP_NAME on the Ray cluster this process belongs to."""
    # Ray and front_processes (which imports it) are optional and ~0.3 s to import: only cluster
    # serving loads them.
    import ray

    from ladle.entrypoints.cluster.front_processes import (
        FrontProcessSpec,
        FrontWorkers,
        serve_front_process,
    )

    peers_dir = tempfile.mkdtemp(prefix="ladle-front-")
    host, port = listener.getsockname()[:2]
    spec = FrontProcessSpec(
        ray_address=ray.get_runtime_context().gcs_address,
        app_name=APP_NAME,
        host=host,
        port=port,
        count=count,
        peers_dir=peers_dir,
        settings=front_settings,
        options=options,
    )
    workers = FrontWorkers(spec) if count > 1 else None
    try:
        if workers is not None:
            workers.start()
        served = serve_front_process(listener, spec, 0, announce, workers)
    finally:
        if workers is not None:
            workers.stop()
            workers.wait_stopped()
        shutil.rmtree(peers_dir, ignore_errors=True)
    return 0 if served else 1


def _serve_on_cluster(app: Any, args: argparse.Namespace, served_name: str, replicas: str) -> int:
    """Deploys `app` behind Ray Serve's proxy on the cluster until SIGTERM / Ctrl-C, then
    deletes only this application."""
    from ray import serve  # optional, ~0.3 s: loaded only when serving on a cluster

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        port = _start_serving(app, args.host, args.port)
        shown = f"[{args.host}]" if ":" in args.host else args.host
        print(
            f"[ladle] serving {served_name} ({replicas} on Ray Serve) on "
            f"http://{shown}:{port} (OpenAI API under /v1; ready: GET /health -> 200)",
            flush=True,
        )
        stop.wait()
    except Exception as error:  # a replica that cannot start: one clear line, then clean up
        print(f"ladle: error: the Ray Serve deployment failed: {error}", file=sys.stderr)
        return 1
    finally:
        import ray  # optional, ~0.3 s: loaded only when serving on a cluster

        try:
            serve.delete(APP_NAME)
        finally:
            ray.shutdown()
    return 0


def _autoscaling_config(
    args: argparse.Namespace, engine_options: dict[str, Any]
) -> dict[str, Any] | None:
    """Ray Serve's autoscaling config from --replicas (the minimum), --max-replicas and
    --target-ongoing-requests; None (a fixed count) without --max-replicas."""
    if args.max_replicas is None:
        if args.target_ongoing_requests is not None:
            raise ValueError("--target-ongoing-requests needs --max-replicas (autoscaling)")
        return None
    if args.max_replicas < args.replicas:
        raise ValueError(
            f"--max-replicas must be >= --replicas (the minimum), got {args.max_replicas} "
            f"< {args.replicas}"
        )
    target = args.target_ongoing_requests
    if target is None:
        target = max(1, int(engine_options.get("max_num_seqs") or 256) // 2)
    if target < 1:
        raise ValueError(f"--target-ongoing-requests must be >= 1, got {target}")
    return {
        "min_replicas": args.replicas,
        "max_replicas": args.max_replicas,
        "target_ongoing_requests": target,
    }


def _start_serving(app: Any, host: str, port: int) -> int:
    """Deploys the application behind Ray Serve's HTTP proxy; returns the port it listens on.

    Port 0 picks a free one now, after ray.init (whose own processes have taken theirs), and on
    the rare loss of that port to another process before the proxy binds it, picks again."""
    from ray import serve  # optional, ~0.3 s: loaded only when serving on a cluster

    num_attempts = 1 if port else 3
    for attempt in range(1, num_attempts + 1):
        chosen = port or _free_port(host)  # Ray's HTTP proxy needs a fixed port
        try:
            serve.start(http_options={"host": host, "port": chosen})
            serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
            return chosen
        except Exception as error:
            if attempt == num_attempts or "bind" not in str(error).lower():
                raise
            print(f"[ladle] port {chosen} was taken before Ray Serve bound it; another", flush=True)
            serve.shutdown()
    raise AssertionError("unreachable")


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
