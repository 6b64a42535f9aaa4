"""`vllm serve`'s HTTP flags that `ladle serve` takes with vLLM's meaning: CORS
(--allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials), --root-path
(behind a proxy that strips a path prefix), HTTPS (--ssl-keyfile, --ssl-certfile, --ssl-ca-certs)
and switches for what ladle does by default: --enable-log-requests (a log line per finished
request; --disable-log-requests turns it off), --disable-uvicorn-access-log (off unless
--access-log); --disable-fastapi-docs (no /docs and /openapi.json); and what responses look
like: --response-role, --return-tokens-as-token-ids, --enable-request-id-headers."""

from __future__ import annotations

import argparse
import json


def add_vllm_server_arguments(group: argparse._ArgumentGroup) -> None:
    """vLLM's spellings; CORS stays off unless --allowed-origins names origins."""
    group.add_argument(
        "--allowed-origins", type=_json_list("--allowed-origins"), default=[],
        help='CORS: origins browsers may call from, a JSON list (\'["*"]\' for any; default: '
        "none, no CORS headers)",
    )
    group.add_argument(
        "--allowed-methods", type=_json_list("--allowed-methods"), default=["*"],
        help="CORS: allowed methods, a JSON list (default: all)",
    )
    group.add_argument(
        "--allowed-headers", type=_json_list("--allowed-headers"), default=["*"],
        help="CORS: allowed request headers, a JSON list (default: all)",
    )
    group.add_argument(
        "--allow-credentials", action="store_true", help="CORS: allow credentials (cookies)"
    )
    group.add_argument(
        "--root-path", default="",
        help="the path prefix a proxy in front strips (uvicorn's root_path), as in vLLM",
    )
    group.add_argument("--ssl-keyfile", default=None, help="HTTPS: the server's private key file")
    group.add_argument(
        "--ssl-certfile", default=None, help="HTTPS: the server's certificate file (with its key)"
    )
    group.add_argument(
        "--ssl-ca-certs", default=None, help="HTTPS: CA certificates to verify clients against"
    )
    group.add_argument(
        "--disable-uvicorn-access-log", action="store_true",
        help="vLLM's switch: ladle's uvicorn access log is off already unless --access-log",
    )
    group.add_argument(
        "--disable-fastapi-docs", action="store_true",
        help="serve no /docs (Swagger UI) and /openapi.json",
    )
    group.add_argument(
        "--response-role", default="assistant", metavar="ROLE",
        help="the role of chat replies' message (and of a stream's first delta) when the "
        "request has add_generation_prompt true; otherwise the last message's role, which the "
        "reply continues (default: assistant)",
    )
    group.add_argument(
        "--return-tokens-as-token-ids", action="store_true",
        help="logprobs name every token 'token_id:N' (tokens that are not valid UTF-8 stay "
        "identifiable); a request may ask the same with return_tokens_as_token_ids",
    )
    group.add_argument(
        "--enable-request-id-headers", action="store_true",
        help="every response carries an X-Request-Id header: the request's own, else a new "
        "random id",
    )
    group.add_argument(
        "--enable-log-requests", action="store_true",
        help="vLLM's switch for a log line per finished request: ladle's default already "
        "(--disable-log-requests turns it off); accepted",
    )


def _json_list(flag: str):
    def parse(text: str) -> list[str]:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise argparse.ArgumentTypeError(
                f"{flag} takes a JSON list of strings, e.g. '[\"*\"]'; got {text!r}"
            ) from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise argparse.ArgumentTypeError(f"{flag} takes a JSON list of strings, got {text!r}")
        return value

    return parse
