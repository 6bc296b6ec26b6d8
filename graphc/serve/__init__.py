"""graphc run's OpenAI-compatible HTTP server (FastAPI + uvicorn) over one Engine.

Routes: POST /v1/chat/completions and /v1/completions (completions.py), POST /v1/audio/speech
(speech.py), POST /v1/audio/transcriptions (transcriptions.py), GET /v1/models, /health and /metrics
(ops.py), WS /v1/realtime (the realtime/ package: OpenAI's Realtime API, speech in and out). One engine thread steps the engine (driver.py); handlers hand it requests and read their
events (context.py). Request bodies are strict (schemas.py); errors use OpenAI's body (errors.py); the
API key, access log and body limit are middleware.py's. Media parts are decoded in the handlers (a
thread pool), never in the engine's thread, and bounded by what the plan's prompts can hold. The server
reads the engine only through its public methods.

    from graphc.serve import serve
    serve(engine, "127.0.0.1", 8000)           # build_app(engine) for the app alone
"""
from graphc.serve.app import build_app, serve

__all__ = ["build_app", "serve"]
