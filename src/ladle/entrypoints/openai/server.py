"""The FastAPI app: routes, auth, error mapping and the engine's life cycle. No engine logic.

    POST /v1/completions        serving_completions.py
    POST /v1/chat/completions   serving_chat.py
    GET  /v1/models, /v1/models/{id}
    GET  /openapi.json, /docs   api_docs.py (behind the API key when one is set)
    GET  /health                200 while the engine process is alive, else 503
    GET  /version
    GET  /metrics               Prometheus (metrics.py)
    POST /v1/kv_transfer/release  a decode server frees KV held here (kv_release.py)
    POST /tokenize, /detokenize   vLLM's token counting routes (serving_tokenization.py; behind
                                  the API key when one is set)

Every error leaves as OpenAI's error body (errors.py); an unexpected exception is a 500 in the
same format, logged with its traceback.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

import ladle
from ladle.entrypoints.openai.api_docs import add_api_docs
from ladle.entrypoints.openai.auth import make_api_key_check, read_body
from ladle.entrypoints.openai.errors import (
    APIError,
    BadRequestError,
    InternalServerError,
    MethodNotAllowedError,
    NotFoundError,
    ServiceUnavailableError,
    error_body,
)
from ladle.entrypoints.openai.kv_release import release_handoffs
from ladle.entrypoints.openai.protocol import ModelCard, ModelList
from ladle.entrypoints.openai.request_id_header import RequestIdHeaderMiddleware
from ladle.entrypoints.openai.request_log import RequestLogMiddleware
from ladle.entrypoints.openai.serving_chat import OpenAIServingChat
from ladle.entrypoints.openai.serving_completions import OpenAIServingCompletion
from ladle.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from ladle.entrypoints.openai.streaming import ClientDisconnected
from ladle.frontend.admission import current_retry_key, retry_key
from ladle.frontend.client import AsyncEngineClient
from ladle.frontend.metrics import CONTENT_TYPE

logger = logging.getLogger("ladle.server")

# nginx's name for "client closed the request"; nobody receives it, but access logs show it.
CLIENT_CLOSED_REQUEST = 499


@dataclass(frozen=True)
class CorsSettings:
    """vLLM's CORS flags; no origins (ladle's default) adds no CORS middleware at all."""

    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str
    # vLLM's further --served-model-name values: accepted in requests, listed in /v1/models.
    other_model_names: tuple[str, ...] = ()
    api_key: str | None = None
    max_request_bytes: int = 4 * 1024 * 1024
    allow_unknown_fields: bool = False

    log_requests: bool = True  # one line per finished request (request_log.py)
    tool_call_parser: str | None = None  # None: chosen from the chat template
    reasoning_parser: str | None = None  # None: chosen from the chat template
    model_root: str | None = None  # /v1/models' `root`: the model as given (vLLM's)
    cors: CorsSettings = CorsSettings()
    serves_api_docs: bool = True  # GET /docs and /openapi.json (vLLM's --disable-fastapi-docs)
    response_role: str = "assistant"  # vLLM's --response-role: the chat reply's role
    return_tokens_as_token_ids: bool = False  # vLLM's: logprobs name tokens `token_id:N`
    request_id_headers: bool = False  # vLLM's --enable-request-id-headers (request_id_header.py)


@dataclass
class _Handlers:
    completions: OpenAIServingCompletion
    chat: OpenAIServingChat
    tokenization: OpenAIServingTokenization


def build_app(
    client: AsyncEngineClient,
    settings: ServerSettings,
    on_refusal: Callable[[int, str], None] | None = None,
) -> FastAPI:
    """The app for one engine client. Its lifespan starts the engine unless it already runs
    (`ladle serve` starts it first, to report a failed start cleanly) and shuts it down.
    on_refusal(status, message) hears of every 429 and too-long 400 (the live log)."""
    handlers: list[_Handlers] = []  # filled once the engine (and tokenizer) is ready

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not client.is_started:
            await client.start()
        chat = OpenAIServingChat(
            client, settings.served_model_name, settings.allow_unknown_fields,
            settings.tool_call_parser, settings.reasoning_parser,
            response_role=settings.response_role,
            return_tokens_as_token_ids=settings.return_tokens_as_token_ids,
        )
        handler_set = _Handlers(
            completions=OpenAIServingCompletion(
                client, settings.served_model_name, settings.allow_unknown_fields,
                return_tokens_as_token_ids=settings.return_tokens_as_token_ids,
            ),
            chat=chat,
            tokenization=OpenAIServingTokenization(client, settings.served_model_name, chat),
        )
        for handler in (handler_set.completions, handler_set.chat, handler_set.tokenization):
            handler.other_model_names = frozenset(settings.other_model_names)
        handlers.append(handler_set)
        try:
            yield
        finally:
            await client.shutdown()

    app = FastAPI(title="ladle", version=ladle.__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    _add_error_handlers(app, client, on_refusal)
    if settings.log_requests:
        app.add_middleware(RequestLogMiddleware)
    if settings.request_id_headers:
        app.add_middleware(RequestIdHeaderMiddleware)
    if settings.cors.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors.allowed_origins),
            allow_methods=list(settings.cors.allowed_methods),
            allow_headers=list(settings.cors.allowed_headers),
            allow_credentials=settings.cors.allow_credentials,
        )
    api_key_check = make_api_key_check(settings.api_key)
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(api_key_check)])

    model_names = (settings.served_model_name, *settings.other_model_names)

    def model_card(name: str) -> ModelCard:
        return ModelCard(
            id=name,
            root=settings.model_root or settings.served_model_name,
            max_model_len=client.info.max_model_len if client.info else None,
        )

    @v1.get("/models")
    async def list_models() -> JSONResponse:
        return JSONResponse(ModelList(data=[model_card(n) for n in model_names]).model_dump())

    # `:path`: served names often hold a '/' (org/name), as the openai client sends them.
    @v1.get("/models/{model_id:path}")
    async def retrieve_model(model_id: str) -> JSONResponse:
        if model_id not in model_names:
            raise NotFoundError(
                f"The model `{model_id}` does not exist; this server serves "
                f"`{settings.served_model_name}`",
                param="model",
                code="model_not_found",
            )
        return JSONResponse(model_card(model_id).model_dump())

    @v1.post("/completions")
    async def create_completion(request: Request) -> Response:
        body = await read_body(request, settings.max_request_bytes)
        _set_retry_key(request, body)
        return await handlers[0].completions.create(body, request)

    @v1.post("/chat/completions")
    async def create_chat_completion(request: Request) -> Response:
        body = await read_body(request, settings.max_request_bytes)
        _set_retry_key(request, body)
        return await handlers[0].chat.create(body, request)

    # Outside the API key: the handoff's own token authorizes it (kv_release.py).
    @app.post("/v1/kv_transfer/release")
    async def release_kv(request: Request) -> JSONResponse:
        """A decode server's word that it has the KV of prompts handed off here
        (frontend/external_handoffs.py): their held blocks are freed now."""
        body = await read_body(request, settings.max_request_bytes)
        return JSONResponse({"released": release_handoffs(client, body)})

    app.include_router(v1)
    if settings.serves_api_docs:
        add_api_docs(app, api_key_check)

    # vLLM serves these at the root, not under /v1.
    @app.post("/tokenize", dependencies=[Depends(api_key_check)])
    async def tokenize(request: Request) -> JSONResponse:
        body = await read_body(request, settings.max_request_bytes)
        return JSONResponse(handlers[0].tokenization.tokenize(body))

    @app.post("/detokenize", dependencies=[Depends(api_key_check)])
    async def detokenize(request: Request) -> JSONResponse:
        body = await read_body(request, settings.max_request_bytes)
        return JSONResponse(handlers[0].tokenization.detokenize(body))

    # /ping is vLLM's (SageMaker's) name for the same check, by GET or POST.
    @app.api_route("/ping", methods=["GET", "POST"])
    @app.get("/health")
    async def health() -> Response:
        problem = client.health_problem
        if problem is not None:
            raise ServiceUnavailableError(problem, code="engine_unavailable")
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": ladle.__version__})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(client.metrics.render(), media_type=CONTENT_TYPE)

    return app


def _set_retry_key(request: Request, body: bytes) -> None:
    """Admission serves refused requests first come, first served; this is how it knows a
    request it refused when the client sends it again."""
    client_host = request.client.host if request.client else ""
    current_retry_key.set(retry_key(client_host, body))


def _add_error_handlers(
    app: FastAPI, client: AsyncEngineClient, on_refusal: Callable[[int, str], None] | None
) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> Response:
        reason = _REJECTION_REASONS.get(error.status_code)
        if reason is not None:
            client.metrics.record_rejected(reason)
        if on_refusal is not None and error.status_code in (400, 413, 429):
            on_refusal(error.status_code, str(error))
        return error.to_response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        if error.status_code == 404:
            api_error_ = NotFoundError(f"no route {request.method} {request.url.path}")
        elif error.status_code == 405:
            api_error_ = MethodNotAllowedError(
                f"method {request.method} is not allowed on {request.url.path}"
            )
        else:
            return JSONResponse(
                error_body(str(error.detail), "invalid_request_error"),
                status_code=error.status_code,
            )
        return api_error_.to_response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> Response:
        return BadRequestError(f"invalid request: {error.errors()[:1]}").to_response()

    @app.exception_handler(ClientDisconnected)
    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, error: Exception) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, error: Exception) -> Response:
        logger.exception("unexpected error on %s %s", request.method, request.url.path)
        return InternalServerError(
            f"internal server error: {type(error).__name__}: {error}"
        ).to_response()


_REJECTION_REASONS = {
    400: "bad_request", 401: "unauthorized", 404: "not_found", 413: "too_large", 429: "queue_full"
}
