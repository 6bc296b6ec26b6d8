"""The app's ASGI middleware: an API key, a JSON access log, and the bound on JSON bodies.

  api key        every route but /health and /ping wants `Authorization: Bearer KEY` (/metrics,
                 /openapi.json and /docs too), else 401 in OpenAI's error body (code invalid_api_key); /health
                 and /ping (liveness probes) stay open; a websocket's upgrade (WS /v1/realtime) without it is
                 refused (HTTP 403)
  access log     one JSON line per HTTP request on the `graphc.access` logger: method, path, status,
                 duration_ms, request_id (the X-Request-Id header, when sent) and client
  body limit     a JSON body over its bound is a 413 from its Content-Length, before a byte of it is read
  request id     an X-Request-Id header (1-128 of A-Z a-z 0-9 . _ : -; else a 400) is echoed on the response
                 and becomes the base of the request's id (request_id() reads it in the handler)
"""
from __future__ import annotations

import hmac
import json
import logging
import re
import sys
import time
from contextvars import ContextVar

from graphc.serve.errors import error
from graphc.serve.schemas import JSON_ROUTES

ACCESS = logging.getLogger("graphc.access")


class AccessLog:
    """ASGI middleware: one JSON line per HTTP request on `graphc.access`, once its response has gone."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, sending)
        finally:
            headers = dict(scope.get("headers") or [])
            rid = headers.get(b"x-request-id")
            client = scope.get("client")
            ACCESS.info(json.dumps({
                "method": scope["method"], "path": scope["path"], "status": status[0],
                "duration_ms": round((time.perf_counter() - t0) * 1e3, 3),
                "request_id": rid.decode("latin-1") if rid else None,
                "client": f"{client[0]}:{client[1]}" if client else None}))


_REQUEST_ID: ContextVar[str | None] = ContextVar("graphc_request_id", default=None)
REQUEST_ID_FORM = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id() -> str | None:
    """The X-Request-Id the client sent with the request being handled, or None."""
    return _REQUEST_ID.get()


class RequestId:
    """ASGI middleware: a well-formed X-Request-Id is the handler's request_id() and is echoed on the response;
    a malformed one is a 400."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        rid = dict(scope.get("headers") or []).get(b"x-request-id") if scope["type"] == "http" else None
        if rid is None:
            return await self.app(scope, receive, send)
        text = rid.decode("latin-1")
        if not REQUEST_ID_FORM.fullmatch(text):
            return await error(400, f"X-Request-Id '{text[:40]}' is not 1-128 of A-Z a-z 0-9 . _ : -",
                               param="X-Request-Id")(scope, receive, send)

        async def echoing(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid)]}
            await send(message)
        token = _REQUEST_ID.set(text)
        try:
            return await self.app(scope, receive, echoing)
        finally:
            _REQUEST_ID.reset(token)


OPEN = ("/health", "/ping")          # liveness probes: no key, and they tell nothing but that the server runs


class ApiKey:
    """ASGI middleware: every route but /health and /ping wants `Authorization: Bearer KEY`; a 401 in OpenAI's
    body otherwise (a websocket's upgrade: refused, HTTP 403)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    def allowed(self, scope) -> bool:
        auth = dict(scope.get("headers") or []).get(b"authorization", b"")
        scheme, _, token = auth.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "websocket":       # WS /v1/realtime: refused at the upgrade (HTTP 403)
            if self.allowed(scope):
                return await self.app(scope, receive, send)
            return await send({"type": "websocket.close", "code": 1008, "reason": "the API key is missing or wrong"})
        if scope["type"] == "http" and path not in OPEN:
            auth = dict(scope.get("headers") or []).get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if not auth:
                message = "no API key: send the header 'Authorization: Bearer KEY'"
            elif scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                message = "the API key is not this server's"
            else:
                return await self.app(scope, receive, send)
            resp = error(401, message, code="invalid_api_key")
            resp.headers["WWW-Authenticate"] = "Bearer"
            return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


def body_limit(max_audio_bytes: int):
    """An HTTP middleware function: 413 before a byte of an oversized JSON body is read (Content-Length),
    so before any GPU work. The bound: media up to max_audio_bytes, base64-encoded, and 1 MiB more."""
    max_body = max_audio_bytes * 4 // 3 + (1 << 20)

    async def limit(request, call_next):
        size = request.headers.get("content-length", "")
        if request.method == "POST" and request.url.path in JSON_ROUTES and size.isdigit() and int(size) > max_body:
            return error(413, f"the request body is {int(size):,} bytes; this server takes at most {max_body:,} "
                              f"(media up to {max_audio_bytes:,} bytes, base64-encoded)", code="request_too_large")
        return await call_next(request)
    return limit


def access_log_to_stderr() -> None:
    """graphc run --access-log: the JSON lines, as they are, on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    ACCESS.addHandler(handler)
    ACCESS.setLevel(logging.INFO)
    ACCESS.propagate = False


def install(app, api_key: str | None, access_log: bool, max_audio_bytes: int) -> None:
    """The body limit, then the request id, the key, the log: each added outside the last, so the log is outermost
    (refused keys are logged too) and a request without the key is refused before its size is looked at."""
    app.middleware("http")(body_limit(max_audio_bytes))
    app.add_middleware(RequestId)
    if api_key:
        app.add_middleware(ApiKey, key=api_key)
    if access_log:
        app.add_middleware(AccessLog)
