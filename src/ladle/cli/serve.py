"""`ladle serve [MODEL]`: the OpenAI-compatible server on uvicorn.

It resolves the model (the embedded default when none is given), starts the engine-core process
(which prints the memory budget), binds to loopback unless --host says otherwise, and prints
where it listens once it does. SIGTERM or Ctrl-C drains: no new connections, in-flight requests
get --shutdown-timeout seconds to finish, then the engine process is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable

# Imported here, not lazily: `ladle.cli` shows `serve` only when this import succeeds, i.e. when
# the server extra is installed.
import uvicorn

from ladle.cli.durations import parse_duration
from ladle.cli.engine_args import add_engine_arguments, engine_options_from_args
from ladle.cli.vllm_server_flags import add_vllm_server_arguments
from ladle.config import EngineConfig
from ladle.entrypoints.chat_template import apply_chat_template_override, load_chat_template
from ladle.entrypoints.openai.live_stats import LiveStatsLogger
from ladle.entrypoints.openai.reasoning_parsers import REASONING_PARSERS
from ladle.entrypoints.openai.request_log import enable_request_logging
from ladle.entrypoints.openai.tool_parsers import TOOL_PARSERS
from ladle.frontend.admission import AdmissionController
from ladle.frontend.restart_policy import RestartPolicy
from ladle.frontend.slo_admission import TtftSloAdmission
from ladle.model.default_model import resolve_default_model
from ladle.threads import configure_api_process_threads

DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"
API_KEY_ENV = "LADLE_API_KEY"


def add_serve_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over an OpenAI-compatible HTTP API (see docs/serving.md).",
    )
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="HF folder, .gguf file or dummy preset; default: SmolLM2-135M",
    )
    parser.add_argument(
        "--model",
        dest="model_option",
        default=None,
        metavar="MODEL",
        help="the model, as a flag (vLLM's spelling); the same as the positional MODEL, which "
        "it replaces when both are given",
    )
    server = parser.add_argument_group("server")
    server.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default: loopback only; 0.0.0.0 for all)",
    )
    server.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    server.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"require 'Authorization: Bearer KEY' on /v1 (or ${API_KEY_ENV})",
    )
    server.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="the model name clients send (default: the model argument); as in vLLM, several "
        "names are all accepted, and responses carry the first",
    )
    server.add_argument("--tokenizer", default=None, help="tokenizer folder, if not the model's")
    server.add_argument(
        "--chat-template",
        default=None,
        help="a Jinja chat template (a file, or the template inline) replacing the tokenizer's",
    )
    server.add_argument(
        "--max-queued-requests",
        type=int,
        default=1024,
        help="sequences waiting for the engine before new requests get 429",
    )
    server.add_argument(
        "--max-queued-tokens",
        type=int,
        default=1 << 20,
        help="prompt tokens waiting for the engine before new requests get 429",
    )
    server.add_argument(
        "--ttft-slo",
        default=None,
        help="time-to-first-token SLO (e.g. 1s): refuse with 429 and a computed "
        "Retry-After the requests predicted to miss it",
    )
    server.add_argument(
        "--stats-interval",
        type=float,
        default=5.0,
        help="seconds between live stats lines while busy (0: none)",
    )
    server.add_argument(
        "--max-request-bytes",
        type=int,
        default=4 * 1024 * 1024,
        help="larger request bodies get 413",
    )
    server.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests get to finish on SIGTERM",
    )
    server.add_argument(
        "--request-timeout",
        type=float,
        default=60.0,
        help="seconds a request's headers and body may take to arrive, else 408 "
        "(slow or silent clients); generating the response is not limited",
    )
    server.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=5.0,
        help="seconds an idle keep-alive connection stays open",
    )
    server.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        help="open connections (and requests in flight) beyond which new requests get 503",
    )
    server.add_argument(
        "--no-engine-restart",
        dest="engine_restart",
        action="store_false",
        help="exit instead of starting a new engine process when one dies",
    )
    server.add_argument(
        "--max-engine-restarts",
        type=int,
        default=3,
        help="engine restarts allowed within --engine-restart-window; one more "
        "death and the server exits non-zero (for a supervisor to act)",
    )
    server.add_argument(
        "--engine-restart-window",
        type=float,
        default=300.0,
        help="seconds over which --max-engine-restarts is counted",
    )
    server.add_argument(
        "--uvicorn-log-level",
        "--log-level",
        dest="log_level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
    )
    server.add_argument(
        "--allow-unknown-fields",
        action="store_true",
        help="accept request fields neither OpenAI nor vLLM defines (default: 400)",
    )

    server.add_argument("--access-log", action="store_true", help="uvicorn's access log too")
    server.add_argument(
        "--disable-log-stats",
        action="store_true",
        help="no periodic engine statistics in the log (as --stats-interval 0)",
    )
    server.add_argument(
        "--disable-log-requests",
        action="store_true",
        help="no log line per finished request (method, route, status, tokens in/out, latency)",
    )
    add_vllm_server_arguments(server)
    server.add_argument(
        "--tool-call-parser",
        default=None,
        choices=sorted(TOOL_PARSERS),
        help="format of the model's tool calls (default: from the chat template)",
    )
    server.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="vLLM's switch for tool_choice 'auto'; accepted, as ladle always parses the tool "
        "calls of requests with tools (the format: --tool-call-parser or the chat template)",
    )
    server.add_argument(
        "--reasoning-parser",
        default=None,
        choices=sorted(REASONING_PARSERS),
        help="split <think> reasoning into reasoning_content (default: from the chat template)",
    )
    cluster = parser.add_argument_group("replicas (Ray Serve; pip install 'ladle[ray]')")
    cluster.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="engine replicas behind this endpoint; >1 runs on Ray Serve",
    )
    cluster.add_argument(
        "--ray-address",
        default=None,
        help="join this Ray cluster (e.g. ray://head:10001 or auto) to deploy",
    )
    cluster.add_argument(
        "--max-replicas",
        type=int,
        default=None,
        help="autoscale between --replicas and this many on ongoing requests "
        "per replica (Ray Serve's autoscaler)",
    )
    cluster.add_argument(
        "--target-ongoing-requests",
        type=int,
        default=None,
        help="with --max-replicas: requests in flight per replica the autoscaler "
        "aims for (default: half of --max-num-seqs)",
    )
    cluster.add_argument(
        "--api-server-count",
        type=int,
        default=None,
        help="processes serving the endpoint in front of the replicas, on one port (default: "
        "one per replica, at most a quarter of the CPU cores); one relays ~13k tokens/s at a "
        "full core (docs/deploy.md)",
    )
    cluster.add_argument(
        "--routing",
        default="prefix",
        choices=["prefix", "round-robin"],
        help="replica choice: prefix-aware (same prompt prefix, same replica, "
        "within a load margin) or round-robin",
    )
    disaggregation = parser.add_argument_group("prefill/decode disaggregation (docs/serving.md)")
    disaggregation.add_argument(
        "--local-replicas",
        type=int,
        default=1,
        metavar="N",
        help="N aggregated engine replicas behind this API process (one GPU each; no Ray): "
        "the other side of `ladle bench serve --compare-disaggregation`",
    )
    disaggregation.add_argument(
        "--disaggregate",
        default=None,
        metavar="xPyD",
        help="run x prefill and y decode engines behind this endpoint, e.g. 1P1D, 2P1D (on "
        "CUDA one GPU each: prefill engines GPUs 0..x-1, decode engines GPUs x..x+y-1): a "
        "prompt is computed on the least loaded prefill engine, its KV moved to the least "
        "loaded decode engine, which streams the rest",
    )
    disaggregation.add_argument(
        "--disaggregate-min-prompt",
        default="0",
        metavar="TOKENS|auto",
        help="with --disaggregate: prompts shorter than this run whole on the least loaded "
        "engine (the engines then act as aggregated replicas); longer ones are split "
        "(default 0: all). "
        "auto: the line follows the measured prompt rate, a prompt runs whole when its "
        "prefill fits the --itl-slo budget (else 50 ms)",
    )
    add_engine_arguments(parser)
    parser.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    # The server stack (fastapi, pydantic, zmq, tokenizers, prometheus_client, uvicorn's HTTP
    # protocol: ~0.35 s) loads only to serve, not for `ladle serve --help` nor other commands.
    from ladle.cli.disagg import build_disaggregated_client
    from ladle.entrypoints.openai.http_server_options import HttpServerOptions
    from ladle.entrypoints.openai.server import CorsSettings, ServerSettings, build_app
    from ladle.frontend.client import AsyncEngineClient, EngineStartError
    from ladle.frontend.metrics import ServerMetrics

    if args.max_request_bytes < 1:
        raise ValueError(f"--max-request-bytes must be >= 1, got {args.max_request_bytes}")
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
    configure_api_process_threads()  # the engine process has the cores' worth of threads
    for flag, value in (
        ("--request-timeout", args.request_timeout),
        ("--keep-alive-timeout", args.keep_alive_timeout),
        ("--max-connections", args.max_connections),
    ):
        if value <= 0:
            raise ValueError(f"{flag} must be > 0, got {value}")
    chat_template = None
    if args.chat_template is not None:
        chat_template = load_chat_template(args.chat_template)
    options = engine_options_from_args(args)
    if args.tokenizer:
        options["tokenizer"] = args.tokenizer
    model = args.model
    if model is None and options["load_format"] != "dummy":
        model = str(resolve_default_model())
        served_name = DEFAULT_SERVED_NAME
    else:
        served_name = model
    other_names: tuple[str, ...] = ()
    if args.served_model_name:
        served_name, *other_names = args.served_model_name
    # Bad options fail here, before a process is spawned, with the field named.
    engine_config = EngineConfig.from_kwargs(model=model, **options)
    if engine_config.model.skip_tokenizer_init:
        _check_no_tokenizer_flags(args)
    if (args.disaggregate is not None or args.local_replicas != 1) and args.replicas != 1:
        raise ValueError(
            "--disaggregate / --local-replicas and --replicas do not combine: pick one"
        )
    if args.replicas != 1 or args.ray_address or args.max_replicas is not None:
        if chat_template is not None:
            raise ValueError("--chat-template is not supported with --replicas / --ray-address")
        if args.ssl_certfile or args.ssl_keyfile:
            # Ray Serve's proxy answers there, not ladle's uvicorn: terminate TLS in front.
            raise ValueError("--ssl-keyfile / --ssl-certfile are not supported with --replicas")
        if args.enable_request_id_headers:
            # The front relays the replicas' responses and sets its own headers.
            raise ValueError("--enable-request-id-headers is not supported with --replicas")
        from ladle.cli.cluster import run_cluster  # Ray's front: only --replicas loads it

        return run_cluster(args, model, served_name, options)
    if args.api_server_count not in (None, 1):
        raise ValueError(
            "--api-server-count sets the processes in front of --replicas N (N > 1); one "
            "`ladle serve` answers from its own API process"
        )
    metrics = ServerMetrics(served_name)
    admission = AdmissionController(args.max_queued_requests, args.max_queued_tokens)
    if args.ttft_slo is not None:
        admission = TtftSloAdmission(
            admission,
            parse_duration(args.ttft_slo),
            lambda: client.stats,
            max_num_seqs=engine_config.scheduler.max_num_seqs,
        )
    restart_policy = RestartPolicy(
        args.engine_restart, args.max_engine_restarts, args.engine_restart_window
    )
    fatal_reasons: list[str] = []

    def on_fatal(reason: str) -> None:
        # The engine is gone for good: stop serving 503s and exit non-zero, so a supervisor
        # (systemd, Kubernetes) restarts the whole server.
        fatal_reasons.append(reason)
        server.should_exit = True

    if args.disaggregate is not None or args.local_replicas != 1:
        client = build_disaggregated_client(
            args.disaggregate, args.local_replicas, {"model": model, **options}, metrics,
            admission, restart_policy, on_fatal, min_prompt_tokens=args.disaggregate_min_prompt,
        )
    else:
        client = AsyncEngineClient(
            {"model": model, **options},
            metrics,
            admission,
            restart_policy=restart_policy,
            on_fatal=on_fatal,
        )
        if options.get("kv_transfer_config") is not None:
            # One instance of a deployment behind vLLM's proxy protocol.
            from ladle.frontend.external_handoffs import ExternalHandoffs
            from ladle.kv_transfer.config import KVTransferConfig

            client.external_handoffs = ExternalHandoffs(
                KVTransferConfig.from_dict(options["kv_transfer_config"]), args.host, args.port
            )
    live_stats = LiveStatsLogger(lambda: client.stats, interval_s=args.stats_interval or 5.0)
    settings = ServerSettings(
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        served_model_name=served_name,
        other_model_names=tuple(other_names),
        api_key=args.api_key or None,
        max_request_bytes=args.max_request_bytes,
        allow_unknown_fields=args.allow_unknown_fields,
        log_requests=not args.disable_log_requests,
        model_root=model,
        serves_api_docs=not args.disable_fastapi_docs,
        response_role=args.response_role,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        request_id_headers=args.enable_request_id_headers,
        cors=CorsSettings(
            allowed_origins=tuple(args.allowed_origins),
            allowed_methods=tuple(args.allowed_methods),
            allowed_headers=tuple(args.allowed_headers),
            allow_credentials=args.allow_credentials,
        ),
    )
    if settings.log_requests:
        enable_request_logging()
    app = build_app(client, settings, on_refusal=live_stats.record_refusal)
    config = HttpServerOptions.from_args(args).uvicorn_config(
        app, host=args.host, port=args.port, root_path=args.root_path
    )
    server = _AnnouncingServer(
        config, served_name, lambda: client.engine_pid, on_exit_signal=client.begin_shutdown,
        on_listening=_tell_port(client),
    )

    async def serve() -> int:
        # The engine starts before uvicorn does, so a model that fails to load is one clear
        # error line (and no port was ever bound), not a lifespan traceback.
        try:
            await client.start()
        except EngineStartError as error:
            print(f"ladle: error: {error}", file=sys.stderr)
            await client.shutdown()
            return 1
        configure_api_process_threads()  # again: loading the tokenizer may have imported torch
        if chat_template is not None and client.tokenizer is not None:
            apply_chat_template_override(client.tokenizer.hf_tokenizer, chat_template)
        log_stats = args.stats_interval > 0 and not args.disable_log_stats
        stats_task = asyncio.create_task(live_stats.run()) if log_stats else None
        try:
            await server.serve()
        finally:
            if stats_task is not None:
                stats_task.cancel()
            await client.shutdown()  # a no-op when the app's lifespan already did it
        if fatal_reasons:
            print(f"ladle: error: {fatal_reasons[0]}", file=sys.stderr)
            return 1
        return 0 if server.started else 1

    try:
        return asyncio.run(serve())
    except KeyboardInterrupt:
        # uvicorn re-raises the Ctrl-C it handled once it has drained and shut down.
        return 0


def _tell_port(client) -> Callable[[int], None] | None:
    """What tells a prefill instance's handoffs the port a decode server reaches it on."""
    handoffs = getattr(client, "external_handoffs", None)
    if handoffs is None:
        return None

    def tell(port: int) -> None:
        handoffs.port = port

    return tell


class _AnnouncingServer(uvicorn.Server):
    """Prints the bound address (the real port when --port 0) once it listens, and tells the
    engine client the moment a SIGTERM / SIGINT starts the shutdown."""

    def __init__(
        self,
        config: uvicorn.Config,
        served_name: str,
        engine_pid: Callable[[], int],
        on_exit_signal: Callable[[], None],
        on_listening: Callable[[int], None] | None = None,
    ):
        """on_listening(port): the port it listens on (the real one when --port 0)."""
        super().__init__(config)
        self.on_listening = on_listening
        self.served_name = served_name
        self.engine_pid = engine_pid
        self.on_exit_signal = on_exit_signal

    def handle_exit(self, sig, frame) -> None:
        # The client hears of the shutdown now, not when the drain ends and the lifespan
        # shuts it down: an engine that dies meanwhile (killed by the same signal) must not
        # be restarted.
        self.on_exit_signal()
        super().handle_exit(sig, frame)

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if not self.started or self.should_exit:
            return
        print(f"[ladle] engine core running in process {self.engine_pid()}", flush=True)
        for listener in self.servers:
            for sock in listener.sockets:
                host, port = sock.getsockname()[:2]
                if self.on_listening is not None:
                    self.on_listening(port)
                shown = f"[{host}]" if ":" in host else host
                scheme = "https" if self.config.is_ssl else "http"
                print(
                    f"[ladle] serving {self.served_name} on {scheme}://{shown}:{port} "
                    "(OpenAI API under /v1; ready: GET /health -> 200)",
                    flush=True,
                )


def _check_no_tokenizer_flags(args: argparse.Namespace) -> None:
    """--skip-tokenizer-init loads no tokenizer: refuse at start-up the flags that need one,
    rather than serve without what they ask for."""
    needing = {
        "--tokenizer": args.tokenizer,
        "--chat-template": args.chat_template,
        "--tool-call-parser": args.tool_call_parser,
        "--reasoning-parser": args.reasoning_parser,
    }
    for flag, value in needing.items():
        if value is not None:
            raise ValueError(f"{flag} needs a tokenizer, and --skip-tokenizer-init loads none")
