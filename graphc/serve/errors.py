"""Errors in OpenAI's body {"error": {message, type, param, code}}: the server's refusals, and the app's
handlers that put FastAPI's and Starlette's own refusals (validation, unknown routes, bodies that do not
parse) in that body too. Validation errors are 400 here, not FastAPI's 422."""
from __future__ import annotations

from graphc.errors import InvalidInput

ROUTES = ("/v1/chat/completions, /v1/completions, /v1/audio/speech, /v1/audio/transcriptions, /v1/models, /health "
          "and /metrics")


class QueueFull(Exception):
    """More requests wait for the engine than the server queues: refused with 429 and Retry-After."""

    def __init__(self, waiting: int, most: int, retry_after: int):
        self.waiting, self.most, self.retry_after = waiting, most, retry_after
        super().__init__(f"the server is full: {waiting} requests wait for the engine, at most {most} may; "
                         f"retry after {retry_after} s, or start the server with a larger --max-waiting")


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
          code: str | None = None):
    """A JSONResponse of `status` in OpenAI's error body."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status)


def wrong_model(asked: str | None, names: tuple[str, ...]):
    """A 404 in OpenAI's body when a request names a model this server does not serve (none of its names), else
    None."""
    if asked is None or asked in names:
        return None
    return error(404, f"model '{asked}' is not served here; this server serves "
                 f"{' or '.join(repr(n) for n in names)}", param="model", code="model_not_found")


def refusal(e: Exception):
    """The error response of a request the server or engine refused: 429 when the queue is full, 400
    for what the request asked; None for anything else (a fault, raised on)."""
    if isinstance(e, QueueFull):
        r = error(429, str(e), kind="requests", code="rate_limit_exceeded")
        r.headers["Retry-After"] = str(e.retry_after)
        return r
    if isinstance(e, InvalidInput):
        return error(400, str(e), param=e.param)
    if isinstance(e, ValueError):
        return error(400, str(e))
    return None


def stream_error(message: str) -> dict:
    """The event a stream ends with when its request failed: OpenAI's error body, a server_error."""
    return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}


async def invalid_body(_req, exc):
    """FastAPI's RequestValidationError as a 400 naming the first field at fault (or the JSON's flaw)."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        where = first.get("ctx", {}).get("error", "")
        return error(400, f"the body is not valid JSON ({where or first.get('msg')}, at character "
                          f"{first.get('loc', ('body', '?'))[-1]})", param=None)
    loc = ".".join(str(x) for x in first.get("loc", ())[1:])
    return error(400, f"{loc or 'body'}: {first.get('msg', 'invalid')}", param=loc or None)


async def http_refusal(_req, exc):
    """Starlette's own refusals (a body that does not parse, no such route, a method not allowed) in
    OpenAI's body, not FastAPI's {"detail": ...}."""
    message = str(exc.detail)
    if exc.status_code == 400 and "parsing the body" in message:
        message = "the body could not be read: send JSON in UTF-8 (Content-Type: application/json)"
    elif exc.status_code == 404:
        message = f"no such route: this server answers {ROUTES}"
    r = error(exc.status_code, message, code="not_found" if exc.status_code == 404 else None)
    for k, v in (exc.headers or {}).items():
        r.headers[k] = v
    return r


def install_handlers(app) -> None:
    """Route the app's validation errors and Starlette's HTTP refusals through OpenAI's error body."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    app.add_exception_handler(RequestValidationError, invalid_body)
    app.add_exception_handler(HTTPException, http_refusal)
