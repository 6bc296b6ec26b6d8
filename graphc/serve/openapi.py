"""The app's OpenAPI schema (/openapi.json, /docs), told what the routes answer."""
from __future__ import annotations

from graphc.serve.schemas import JSON_ROUTES

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
ERRORS = {"400": "the request is malformed or asks what the plan cannot serve (the message says which and why)",
          "404": "the model named is not served here", "413": "the body is over the size limit",
          "429": "the queue is full; Retry-After says when to try again",
          "500": "the engine failed this request (a device's worker died, or a step raised): the server ends"}
OBJECT = {"type": "object"}
ANSWERS = {  # route -> (the JSON answer's required fields, further media types of a 200)
    "/v1/chat/completions": (["id", "object", "created", "model", "choices"], ["text/event-stream"]),
    "/v1/completions": (["id", "object", "created", "model", "choices"], ["text/event-stream"]),
    "/v1/audio/speech": (None, ["text/event-stream", "audio/wav", "audio/pcm", "audio/flac", "audio/mpeg",
                                "audio/ogg"]),
    "/v1/models": (["object", "data"], []),
    "/health": (["status", "running", "waiting", "free_pages", "pages"], []),
}


FORM = {"type": "object", "required": ["file"], "properties": {
    "file": {"type": "string", "format": "binary"}, "model": {"type": "string"}, "language": {"type": "string"},
    "prompt": {"type": "string"}, "response_format": {"type": "string", "enum": ["json", "text", "verbose_json"]},
    "temperature": {"type": "number"}, "stream": {"type": "boolean"}}}
PLAIN = {  # routes FastAPI does not describe (a Starlette route, one left out of its schema): what they take and give
    "/v1/audio/transcriptions": {"post": {
        "summary": "Transcriptions", "description": "OpenAI's multipart form, on a plan with an a2t kind",
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": FORM}}},
        "responses": {"200": {"description": "the transcript", "content": {
            "application/json": {"schema": {**OBJECT, "required": ["text"]}}, "text/plain": {"schema": {"type": "string"}},
            "text/event-stream": {"schema": {"type": "string"}}}}}}},
    "/metrics": {"get": {"summary": "Metrics", "description": "Prometheus text (docs/serving.md, Metrics)",
                         "responses": {"200": {"description": "the metrics", "content": {
                             "text/plain": {"schema": {"type": "string"}}}}}}},
}


def document(schema: dict, keyed: bool) -> dict:
    """FastAPI's schema of this app, told what the routes answer: OpenAI's error body for 400 (not
    FastAPI's 422: validation errors are 400 here), 404, 413, 429 (with Retry-After) and 500; 401 on every
    route but /health when an API key is set; the media types and required fields of a 200. Routes FastAPI
    does not describe are added from PLAIN."""
    for path, ops in PLAIN.items():
        schema.setdefault("paths", {}).setdefault(path, ops)
    for path, ops in schema.get("paths", {}).items():
        for op in ops.values():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            required, media = ANSWERS.get(path, (None, []))
            ok = responses.setdefault("200", {"description": "the answer"})
            content = ok.setdefault("content", {})
            if path == "/v1/audio/speech":
                content.pop("application/json", None)
            elif required:
                content["application/json"] = {"schema": {**OBJECT, "required": required}}
            for m in media:
                content[m] = {"schema": {"type": "string"}}
            if path in JSON_ROUTES:
                for code, what in ERRORS.items():
                    responses[code] = {"description": what, "content": {"application/json": {"schema": ERROR}}}
                responses["429"]["headers"] = {"Retry-After": {"schema": {"type": "integer"},
                                                               "description": "seconds"}}
            if path == "/v1/audio/transcriptions":
                for code, what in ERRORS.items():
                    responses[code] = {"description": what, "content": {"application/json": {"schema": ERROR}}}
            if keyed and path not in ("/health", "/ping"):
                responses["401"] = {"description": "no API key, or not this server's",
                                    "content": {"application/json": {"schema": ERROR}}}
    for name in ("HTTPValidationError", "ValidationError"):
        schema.get("components", {}).get("schemas", {}).pop(name, None)
    return schema


def install(app, keyed: bool) -> None:
    """app.openapi: FastAPI's schema through document(), made once, when first asked for."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            app.openapi_schema = document(get_openapi(title=app.title, version=app.version, routes=app.routes), keyed)
        return app.openapi_schema
    app.openapi = openapi
