"""GET /openapi.json and GET /docs (Swagger UI), behind the API key when one is set.

The two generation routes read their bodies themselves (to enforce the size limit and parse in
strict mode), so FastAPI cannot infer their request schemas; they are filled in here from the
pydantic request models, so the documented bodies are the ones the server validates against.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse

from ladle.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

OPENAPI_PATH = "/openapi.json"
DOCS_PATH = "/docs"
_REQUEST_BODIES = {
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
}


def add_api_docs(app: FastAPI, api_key_check: Callable[[Request], Awaitable[None]]) -> None:
    """Register the two routes on `app`; `api_key_check` guards them as it guards /v1."""
    router = APIRouter(dependencies=[Depends(api_key_check)])
    cache: dict[str, dict] = {}

    @router.get(OPENAPI_PATH, include_in_schema=False)
    async def openapi_json() -> JSONResponse:
        if "schema" not in cache:
            cache["schema"] = build_openapi_schema(app)
        return JSONResponse(cache["schema"])

    @router.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=OPENAPI_PATH, title=f"{app.title} API")

    app.include_router(router)


def build_openapi_schema(app: FastAPI) -> dict:
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, model in _REQUEST_BODIES.items():
        operation = schema.get("paths", {}).get(path, {}).get("post")
        if operation is None:
            continue
        model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(model_schema.pop("$defs", {}))
        components[model.__name__] = model_schema
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }
    return schema
