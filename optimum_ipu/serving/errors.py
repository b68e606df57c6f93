"""Errors of the server, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every malformed request gets a 4xx whose message is one line naming the field, the value given and the fix, so
that a client library (the `openai` package raises `BadRequestError` with it) shows the user what to change.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

# the `type` of an error body, by status: what OpenAI's API sends for the same case
_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout",
}


class APIError(Exception):
    """An error answered to the client with `status` and OpenAI's error body.

    Args:
        status (`int`): the HTTP status.
        message (`str`): one line: the field, the value and the fix.
        param (`str`, *optional*): the request field at fault (`"max_tokens"`, `"messages.0.role"`).
        headers (`dict`, *optional*): extra response headers (`Retry-After` of a 429).
    """

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}


def bad_request(param: str, value: Any, fix: str) -> APIError:
    """A 400 naming the field, its value (shortened) and the fix: `"max_tokens: got -1; give an integer >= 1"`."""
    return APIError(400, f"{param}: got {short_repr(value)}; {fix}", param)


def short_repr(value: Any, limit: int = 80) -> str:
    """`repr(value)` on one line, cut to `limit` characters (a request may hold a whole document)."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body."""
    message = " ".join(str(message).split())  # one line, whatever the exception held
    kind = _TYPES.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


_SCALARS = ("str", "int", "float", "bool", "dict", "list", "none")


def _union_member(part: Any) -> bool:
    """Whether a part of pydantic's error location names a member of a union (`str`, `list[str]`), not a field."""
    return isinstance(part, str) and (part in _SCALARS or "[" in part or part.startswith("function-"))


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str]:
    """`(param, message)` of pydantic's first error: the field as a dotted path, what was given, what is expected
    (for a field of several types, each of them)."""
    error = errors[0]
    raw = [part for part in error.get("loc", ()) if part not in ("body", "query", "path", "form")]
    cut = next((i for i, part in enumerate(raw) if _union_member(part)), len(raw))
    param = ".".join(str(part) for part in raw[:cut]) or "body"
    if cut < len(raw):  # a value of none of a union's types: name them all
        prefix = tuple(raw[:cut])
        members = []
        for other in errors:
            loc = tuple(p for p in other.get("loc", ()) if p not in ("body", "query", "path", "form"))
            if loc[:cut] == prefix and len(loc) > cut and loc[cut] not in members:
                members.append(loc[cut])
        return param, f"{param}: got {short_repr(error.get('input'))}; expected {' or '.join(map(str, members))}"
    kind = error.get("type", "")
    if kind == "json_invalid":
        return "body", f"body: not valid JSON ({error.get('ctx', {}).get('error', 'parse error')}); send a JSON object"
    if kind == "missing":
        return param, f"{param}: missing; it is required"
    if kind == "extra_forbidden":
        return param, f"{param}: not a field of this request; remove it"
    given = short_repr(error.get("input"))
    return param, f"{param}: got {given}; {error.get('msg', 'invalid value')}"


def install_error_handlers(app: Any) -> None:
    """Answer every error of `app` in OpenAI's shape: request validation (400, naming the field), `APIError`,
    Starlette's HTTP errors (404 of an unknown path, 405) and anything unexpected (500, logged)."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        param, message = _validation_message(errors) if errors else ("body", "body: invalid request")
        return error_response(400, message, param)

    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no endpoint {request.url.path}; GET /v1/models lists the model, /docs the endpoints"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}; see /docs for the method"
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, message, None, getattr(exc, "headers", None))
