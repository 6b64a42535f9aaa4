"""Errors in OpenAI's format: `{"error": {"message", "type", "param", "code"}}` with the status
code OpenAI would use, so clients (the official SDK included) raise their usual exceptions.

Everything a client can get wrong maps to a 4xx here; a 5xx means the server or the engine
failed, never the input.
"""

from __future__ import annotations

import json
import re

from fastapi.responses import JSONResponse
from pydantic import ValidationError


class APIError(Exception):
    """An error answered with an OpenAI-style body. Subclasses fix the status and type."""

    status_code = 400
    error_type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.error_type, self.param, self.code)

    def to_response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)

    def to_sse(self) -> str:
        """The error as a server-sent event, for a stream whose 200 status is already sent."""
        return f"data: {json.dumps(self.body())}\n\n"


class BadRequestError(APIError):
    status_code = 400


class AuthenticationError(APIError):
    status_code = 401
    error_type = "authentication_error"


class NotFoundError(APIError):
    status_code = 404


class MethodNotAllowedError(APIError):
    status_code = 405


class RequestTooLargeError(APIError):
    status_code = 413


class RateLimitError(APIError):
    status_code = 429
    error_type = "rate_limit_error"


class InternalServerError(APIError):
    status_code = 500
    error_type = "server_error"


class ServiceUnavailableError(APIError):
    status_code = 503
    error_type = "service_unavailable"


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def from_validation_error(error: ValidationError) -> BadRequestError:
    """A 400 naming the first offending field (pydantic lists every union branch that failed;
    the first message is the one a person wants)."""
    details = error.errors(include_url=False, include_input=False)
    if not details:
        return BadRequestError("the request body is invalid")
    first = details[0]
    if first["type"] == "json_invalid":
        return BadRequestError(f"the request body is not valid JSON: {first['msg']}")
    # Union branches append their type name to the location; keep only field names and indices.
    location = [str(part) for part in first["loc"] if isinstance(part, int) or _is_field(part)]
    param = ".".join(location) or None
    if first["type"] == "model_type":
        return BadRequestError("the request body must be a JSON object")
    if first["type"] == "missing":
        return BadRequestError(f"missing required field {param!r}", param=param)
    where = f"{param}: " if param else ""
    return BadRequestError(f"{where}{first['msg']}", param=param)


_UNION_BRANCH_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _is_field(part: object) -> bool:
    # Branch tags look like 'str', 'list[int]', 'function-after[...]'; field names are plain.
    return (
        isinstance(part, str)
        and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part) is not None
        and part not in _UNION_BRANCH_TAGS
    )


def from_value_error(error: ValueError) -> BadRequestError:
    """A 400 from a ValueError whose message starts with the field it names (SamplingParams)."""
    message = str(error)
    match = re.match(r"([a-z_]+) ", message)
    return BadRequestError(message, param=match.group(1) if match else None)
