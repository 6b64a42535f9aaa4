"""build_app(...): ladle as a Ray Serve application, for `serve run`, `serve deploy` or
`ladle serve --replicas N`.

    from ladle.entrypoints.cluster.app import build_app
    app = build_app("path/to/model", num_replicas=2)          # then serve.run(app)

or in a Serve config file (`serve run config.yaml`):

    applications:
      - name: ladle
        import_path: ladle.entrypoints.cluster.app:app_builder
        args: {model: /models/llama, num_replicas: 2, max_model_len: 8192}

Two deployments: LadleIngress (the HTTP endpoint behind Ray Serve's proxy, one replica) and
LadleReplica (one ladle engine and its own HTTP server each, N replicas, one GPU each when the
engine runs on CUDA, else CPU), the second routed by PrefixAwareRequestRouter. Responses stream
from the replica's HTTP server through the ingress (front.py), never as Ray objects.
`ladle serve --replicas N` deploys only the replicas (build_replicas) and runs the front in its
own process, which also takes Ray Serve's proxy out of the token path. `autoscaling_config`
replaces the fixed count with Ray Serve's autoscaler on ongoing requests per replica
(docs/deploy.md has an example).
"""

from __future__ import annotations

from typing import Any

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from ladle.cli.durations import parse_duration
from ladle.config import EngineConfig
from ladle.entrypoints.cluster.front import ENGINE_DEPLOYMENT_NAME, FrontSettings
from ladle.entrypoints.cluster.ingress import LadleIngress
from ladle.entrypoints.cluster.prefix_routing import (
    DEFAULT_LOAD_MARGIN,
    DEFAULT_MAX_TRACKED_PREFIXES,
    DEFAULT_PREFIX_BLOCKS,
)
from ladle.entrypoints.cluster.replica import LadleReplica
from ladle.entrypoints.cluster.replica_settings import ReplicaServerSettings
from ladle.entrypoints.cluster.round_robin import ROUTING_POLICIES
from ladle.frontend.tokenizer_source import resolve_tokenizer_source
from ladle.model.default_model import resolve_default_model

DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"
_ROUTER_CLASS = "ladle.entrypoints.cluster.request_router:PrefixAwareRequestRouter"


def build_app(model: str | None = None, **options: Any) -> serve.Application:
    """A Ray Serve application serving `model` (default: the embedded SmolLM2-135M) from
    `num_replicas` ladle engines behind one OpenAI-compatible endpoint (Ray Serve's HTTP proxy
    and the LadleIngress deployment). options: build_replicas's keywords."""
    replicas, front_settings = build_replicas(model, **options)
    num_asked = front_settings.num_replicas_asked
    ingress = serve.deployment(LadleIngress, name="LadleIngress").options(
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},
        logging_config={"enable_access_log": False},
        max_ongoing_requests=max(_max_ongoing(options) * max(num_asked, 1), 1024),
    )
    return ingress.bind(replicas, front_settings)


def build_replicas(
    model: str | None = None,
    *,
    num_replicas: int = 1,
    autoscaling_config: dict[str, Any] | None = None,
    num_gpus_per_replica: float | None = None,
    num_cpus_per_replica: float = 1.0,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_request_bytes: int = 4 * 1024 * 1024,
    allow_unknown_fields: bool = False,
    max_queued_requests: int = 1024,
    max_queued_tokens: int = 1 << 20,
    ttft_slo: str | float | None = None,
    stats_interval: float = 5.0,
    log_requests: bool = True,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
    response_role: str = "assistant",
    return_tokens_as_token_ids: bool = False,
    shutdown_timeout: float = 30.0,
    routing: str = "prefix",
    load_margin: int = DEFAULT_LOAD_MARGIN,
    num_prefix_blocks: int = DEFAULT_PREFIX_BLOCKS,
    replica_http_host: str | None = None,
    **engine_options: Any,
) -> tuple[serve.Application, FrontSettings]:
    """The LadleReplica deployment bound to its options (an application of its own, with no
    HTTP route: `ladle serve --replicas N` fronts it itself) and what a front needs to route to
    it.

    engine_options: EngineConfig's keyword arguments (max_model_len, block_size, device, ...).
    num_gpus_per_replica: None picks 1 when the engine will run on CUDA, else 0.
    autoscaling_config: Ray Serve's, e.g. {"min_replicas": 1, "max_replicas": 4,
    "target_ongoing_requests": 32}; the fixed num_replicas is then ignored.
    routing: "prefix" (prefix-aware, the default) or "round-robin" (each replica in turn).
    load_margin: a prefix's replica keeps it until its queue exceeds the least loaded's by this.
    The server options (api_key ... return_tokens_as_token_ids) are `ladle serve`'s flags,
    applied by each replica: ttft_slo ('1s', '500ms' or seconds) refuses with 429 the requests
    predicted to miss it, stats_interval is each replica's live stats line (0: none),
    shutdown_timeout the seconds in-flight requests get when a replica stops.
    replica_http_host: where each replica's own HTTP server listens (None: its node's IP).
    Raises ValueError on bad options, naming the field.
    """
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if routing not in ROUTING_POLICIES:
        raise ValueError(f"routing must be one of {ROUTING_POLICIES}, got {routing!r}")
    if shutdown_timeout < 0:
        raise ValueError(f"shutdown_timeout must be >= 0, got {shutdown_timeout}")
    if model is None and engine_options.get("load_format") != "dummy":
        model = str(resolve_default_model())
        served_model_name = served_model_name or DEFAULT_SERVED_NAME
    served_model_name = served_model_name or str(model)
    settings = ReplicaServerSettings(
        served_model_name=served_model_name,
        api_key=api_key or None,
        max_request_bytes=max_request_bytes,
        allow_unknown_fields=allow_unknown_fields,
        max_queued_requests=max_queued_requests,
        max_queued_tokens=max_queued_tokens,
        ttft_slo_s=None if ttft_slo is None else parse_duration(str(ttft_slo)),
        stats_interval_s=stats_interval,
        log_requests=log_requests,
        tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
        response_role=response_role,
        return_tokens_as_token_ids=return_tokens_as_token_ids,
        http_host=replica_http_host,
    )
    engine_options = {"model": model, **engine_options}
    config = EngineConfig.from_kwargs(**engine_options)  # fails here, before Ray, when bad
    if num_gpus_per_replica is None:
        num_gpus_per_replica = 1.0 if _runs_on_cuda(engine_options.get("device", "auto")) else 0.0
    max_ongoing = _max_ongoing(engine_options)

    replica = serve.deployment(LadleReplica, name=ENGINE_DEPLOYMENT_NAME).options(
        ray_actor_options={"num_cpus": num_cpus_per_replica, "num_gpus": num_gpus_per_replica},
        max_ongoing_requests=max_ongoing,
        health_check_period_s=2.0,
        # ladle logs each request itself (--disable-log-requests); Ray's line per slot call
        # would repeat it and cost each replica a log line per request.
        logging_config={"enable_access_log": False},
        health_check_timeout_s=30.0,
        graceful_shutdown_timeout_s=shutdown_timeout,
        request_router_config=replica_router_config(routing, load_margin),
        **(
            {"autoscaling_config": autoscaling_config}
            if autoscaling_config
            else {"num_replicas": num_replicas}
        ),
    )
    num_asked = (
        int(autoscaling_config.get("min_replicas", 1)) if autoscaling_config else num_replicas
    )
    front_settings = FrontSettings(
        tokenizer_path=routing_tokenizer_source(config, model),
        block_size=config.cache.block_size,
        num_prefix_blocks=num_prefix_blocks,
        num_replicas_asked=num_asked,
    )
    return replica.bind(engine_options, settings), front_settings


def replica_router_config(routing: str, load_margin: int) -> RequestRouterConfig:
    """Ray Serve's request router for the engine deployment: PrefixAwareRequestRouter, built
    by Ray in every process that holds a handle to the deployment (each front process)."""
    return RequestRouterConfig(
        request_router_class=_ROUTER_CLASS,
        request_router_kwargs={
            "load_margin": load_margin,
            "max_tracked_prefixes": DEFAULT_MAX_TRACKED_PREFIXES,
            "policy": routing,
        },
    )


def routing_tokenizer_source(config: Any, model: str | None) -> str | None:
    """The tokenizer the replicas run with, found as the engine finds it, for the front's
    prefix keys. A preset of random weights has no tokenizer of its own: its name is never
    looked up on the hub (offline, that lookup retried for ~25 s before every start)."""
    # The loader imports torch (~1 s), which the driver and front processes need not load.
    from ladle.model.loader.presets import get_preset

    is_preset = model is not None and get_preset(model) is not None
    model_path = None if config.model.load_format == "dummy" and is_preset else model
    return resolve_tokenizer_source(config.model, model_path)


def _max_ongoing(engine_options: dict[str, Any]) -> int:
    """Requests in flight per replica Ray lets through: twice the engine's batch."""
    return max(2 * int(engine_options.get("max_num_seqs") or 256), 64)


def app_builder(args: dict[str, Any]) -> serve.Application:
    """The `import_path` target for Serve config files: `args` are build_app's keywords."""
    return build_app(**dict(args))


def _runs_on_cuda(device: str) -> bool:
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    if ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0:
        return True
    import torch  # ~1 s, for the one question: the driver runs no model

    return torch.cuda.is_available()
