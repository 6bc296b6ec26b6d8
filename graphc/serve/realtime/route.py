"""WS /v1/realtime?model=NAME: OpenAI's Realtime API over the engine (speech in, speech out, server VAD,
barge-in; ?intent=transcription for a transcription session). The API key, when the server has one, is
checked at the upgrade as on the HTTP routes (middleware.py).

Limits: at most `max_sessions` sessions at once (another is accepted and closed at once with code 1013,
"try again later", after an error event saying why); a session idle for `idle_s` seconds (no client event,
nothing generating) is closed (1000); its input buffer holds at most the audio a prompt of the plan holds.
A session that ends, however it ends, aborts what it has in the engine.
"""
from __future__ import annotations

from dataclasses import dataclass

from starlette.websockets import WebSocket

from graphc.serve.context import Context
from graphc.serve.realtime.metrics import RealtimeMetrics
from graphc.serve.realtime.protocol import BETA_HEADER, Wire, new_id

DEFAULT_MAX_SESSIONS = 64
DEFAULT_IDLE_S = 600.0


@dataclass(frozen=True)
class RealtimeLimits:
    max_sessions: int = DEFAULT_MAX_SESSIONS     # graphc run --max-realtime-sessions
    idle_s: float = DEFAULT_IDLE_S               # graphc run --realtime-idle-timeout


def voices(ctx: Context) -> tuple[str, ...]:
    """The plan's voices (none when it does not speak)."""
    return tuple(sorted(ctx.engine.host.speech.voices)) if ctx.engine.speaks else ()


def default_voice(ctx: Context) -> str | None:
    return ctx.engine.host.speech.default_voice if ctx.engine.speaks else None


def register(app, ctx: Context) -> None:
    """Add the websocket route to `app`; its limits are app.state.realtime's (a RealtimeLimits)."""
    limits: RealtimeLimits = getattr(app.state, "realtime", RealtimeLimits())
    metrics = RealtimeMetrics(app.state.metrics.registry)
    open_now = [0]

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket):
        await ws.accept()
        wire = Wire(ws.headers.get("openai-beta", "").strip() == BETA_HEADER)
        refused = refusal(ctx, ws.query_params, open_now[0], limits)
        if refused is not None:
            code, message, param = refused
            metrics.sessions.labels("refused").inc()
            await ws.send_json(wire.error(message, "session_refused", param=param))
            await ws.close(code, message[:120])
            return
        open_now[0] += 1
        metrics.open.inc()
        metrics.sessions.labels("opened").inc()
        try:
            await session(ws, ctx, wire, metrics, limits)
        finally:
            open_now[0] -= 1
            metrics.open.dec()


def refusal(ctx: Context, query, open_now: int, limits: RealtimeLimits) -> tuple[int, str, str | None] | None:
    """(close code, why, the parameter at fault) of a session that cannot open, else None."""
    if open_now >= limits.max_sessions:
        return 1013, (f"the server is full: {open_now} realtime sessions are open, at most {limits.max_sessions} "
                      "may be (graphc run --max-realtime-sessions); try again later"), None
    model = query.get("model")
    if model is not None and model not in ctx.names:
        return 1008, (f"model '{model}' is not served here; this server serves "
                      f"{' or '.join(repr(n) for n in ctx.names)}"), "model"
    if ctx.engine.template is None or ctx.engine.tokenizer is None:
        return 1008, ("realtime sessions render their conversation with a tokenizer and chat template: start the "
                      "server with --tokenizer DIR (or --checkpoint DIR) holding tokenizer.json and the template"), "model"
    intent = query.get("intent")
    if intent not in (None, "transcription"):
        return 1008, f"intent '{intent}' is not served; leave it out, or give intent=transcription", "intent"
    return None


async def session(ws, ctx: Context, wire: Wire, metrics, limits: RealtimeLimits) -> None:
    from starlette.concurrency import run_in_threadpool

    from graphc.errors import InvalidInput
    from graphc.serve.realtime.connection import Connection
    from graphc.serve.realtime.session import new_config
    from graphc.serve.realtime.transcribe import check
    from graphc.serve.realtime.vad import new_model

    transcription = ws.query_params.get("intent") == "transcription"
    if transcription:
        try:
            check(ctx, None)
        except InvalidInput as e:
            await ws.send_json(wire.error(str(e), "session_refused", param="intent"))
            await ws.close(1008, "this plan cannot transcribe")
            return
    config = new_config(new_id("sess"), ctx.model_name, default_voice(ctx), transcription, ctx.engine.speaks)
    model = await run_in_threadpool(new_model)
    await Connection(ws, ctx, wire, config, metrics, model, limits.idle_s, voices(ctx)).run()
