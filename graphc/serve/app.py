"""graphc run's app over one Engine: build_app() wires the Driver (the engine thread), the routes, the
error handlers, the middleware and the OpenAPI schema; serve() runs it under uvicorn."""
from __future__ import annotations

import logging
import threading

from graphc.errors import InvalidInput, Stopped
from graphc.runtime.engine import Engine
from graphc.runtime.inputs import Sources
from graphc.runtime.workers import WorkerDied
from graphc.serve import completions, middleware, openapi, ops, speech, tokens, transcriptions
from graphc.serve.context import Context
from graphc.serve.driver import Driver
from graphc.serve.realtime import route as realtime
from graphc.serve.realtime.route import RealtimeLimits
from graphc.serve.errors import install_handlers
from graphc.serve.transcriptions import DEFAULT_MAX_AUDIO_BYTES

log = logging.getLogger("graphc.server")
DEFAULT_SHUTDOWN_S = 30.0     # graphc run --shutdown-timeout: what requests in flight get to finish on a signal
FAIL_GRACE_S = 1.0            # after that, the seconds their error events get to reach the clients


def build_app(engine: Engine, name: str | list[str] | None = None, *, api_key: str | None = None, access_log: bool = False,
              max_audio_bytes: int = DEFAULT_MAX_AUDIO_BYTES, on_death=None, max_waiting: int | None = None,
              sources: Sources = Sources(paths=False), trust_request_chat_template: bool = False,
              realtime_limits: RealtimeLimits = RealtimeLimits(), gather_ms: float | None = None):
    """name: the model's name the routes answer to (default: the plan's), or several (responses carry the
    first: --served-model-name); api_key: every route but /health
    wants it as a bearer token; access_log: a JSON line a request on `graphc.access` (middleware.py);
    max_audio_bytes: the largest transcription upload (transcriptions.py), and the media a JSON body may
    carry; on_death: Driver's; max_waiting: the queue's bound (Driver's); sources: where media parts may be
    read from (default: their bytes only, no file and no URL); trust_request_chat_template: a chat request may
    bring its own chat_template (else it is refused); realtime_limits: WS /v1/realtime's sessions at once and idle
    time (realtime/route.py); gather_ms: how long an idle engine waits for requests still preparing (Driver's)."""
    from fastapi import FastAPI

    app = FastAPI(title="graphc", version="1")
    if getattr(engine, "engines", None) is not None:     # a plan of replicas: a Driver each, requests routed
        from graphc.serve.router import Router
        driver = Router(engine, on_death, max_waiting, gather_ms)
    else:
        driver = Driver(engine, on_death, max_waiting, gather_ms)
    app.state.driver = driver
    app.router.on_shutdown.append(driver.close)
    names = [name] if isinstance(name, str) else list(name or [engine.model_name])
    ctx = Context(engine, driver, names[0], max_audio_bytes, sources, engine.media_limits(), tuple(names[1:]),
                  trust_request_chat_template)
    install_handlers(app)
    app.state.realtime = realtime_limits
    for routes in (ops, completions, speech, transcriptions, tokens, realtime):
        routes.register(app, ctx)
    middleware.install(app, api_key, access_log, max_audio_bytes)
    openapi.install(app, bool(api_key))
    return app


def serve(engine: Engine, host: str = "127.0.0.1", port: int = 8000, *, api_key: str | None = None,
          access_log: bool = False, max_audio_bytes: int = DEFAULT_MAX_AUDIO_BYTES, max_waiting: int | None = None,
          media_dir: str | None = None, media_urls: bool = False, exit_on_death: bool = True,
          shutdown_timeout: float = DEFAULT_SHUTDOWN_S, served_model_name: list[str] | None = None,
          trust_request_chat_template: bool = False, max_realtime_sessions: int = RealtimeLimits.max_sessions,
          realtime_idle_timeout: float = RealtimeLimits.idle_s, gather_ms: float | None = None) -> WorkerDied | None:
    """Serve until stopped. SIGINT or SIGTERM stops it within shutdown_timeout seconds (stopping_server); a second
    one stops it at once and raises Stopped. A device's worker that dies ends it: the process exits with code 3 a
    moment after the requests in flight got their error, or, with exit_on_death=False (graphc run --ray: the
    server runs in a Ray actor), the server stops and the WorkerDied is returned."""
    import uvicorn

    died: list[WorkerDied] = []

    def stop(e: WorkerDied) -> None:
        log.critical("graphc: %s; the server stops", e)
        died.append(e)
        threading.Timer(1.0, setattr, (server, "should_exit", True)).start()     # a moment to send the errors

    app = build_app(engine, served_model_name, api_key=api_key, access_log=access_log, max_audio_bytes=max_audio_bytes,
                    on_death=None if exit_on_death else stop, max_waiting=max_waiting,
                    sources=media_sources(media_dir, media_urls),
                    trust_request_chat_template=trust_request_chat_template,
                    realtime_limits=RealtimeLimits(max_realtime_sessions, realtime_idle_timeout), gather_ms=gather_ms)
    if access_log:
        middleware.access_log_to_stderr()
    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=shutdown_timeout + FAIL_GRACE_S)
    server = stopping_server(config, app.state.driver, shutdown_timeout)
    server.run()
    if server.forced is not None:
        app.state.driver.close()          # the engine thread ends after its step (no lifespan shutdown ran)
        raise Stopped(server.forced)
    return died[0] if died else None


def stopping_server(config, driver, shutdown_timeout: float):
    """uvicorn's Server, stopping as graphc run promises: the first SIGINT or SIGTERM prints one line, the
    server takes no new connection, requests in flight get shutdown_timeout seconds to finish, then every one
    left ends with an error event (driver.fail_all) and the process leaves without re-raising the signal (exit
    0, no traceback). A second SIGINT or SIGTERM prints one line, ends every request left with an error event
    at once, gives those events FAIL_GRACE_S to leave, then stops without waiting for the connections; its
    number is `forced` (serve raises Stopped: graphc run exits 130 or 143, no traceback). A third stops
    without the grace."""
    import signal
    import sys

    import uvicorn

    class Stopping(uvicorn.Server):
        forced: int | None = None              # the signal that stopped the server at once

        def handle_exit(self, sig, frame) -> None:
            if self.should_exit:
                self.stop_now(sig)
                return
            super().handle_exit(sig, frame)
            self._captured_signals.clear()          # stopped as asked: nothing to re-raise after the shutdown
            print(f"graphc run: {signal.Signals(sig).name}: stopping; requests in flight have "
                  f"{shutdown_timeout:g} s to finish", file=sys.stderr, flush=True)
            timer = threading.Timer(shutdown_timeout, driver.fail_all, ("the server is shutting down (SIGINT or SIGTERM)",))
            timer.daemon = True
            timer.start()

        def stop_now(self, sig) -> None:
            if self.forced is not None:
                self.force_exit = True
                return
            self.forced = sig
            print(f"graphc run: {signal.Signals(sig).name} again: stopping now; requests in flight end with an "
                  "error", file=sys.stderr, flush=True)
            # the tasks cancelled below are stopped as asked: uvicorn would log each with its traceback
            logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL + 1)
            driver.fail_all("the server is stopping now (a second SIGINT or SIGTERM)")
            timer = threading.Timer(FAIL_GRACE_S, setattr, (self, "force_exit", True))
            timer.daemon = True
            timer.start()

    return Stopping(config)


def media_sources(media_dir: str | None, media_urls: bool) -> Sources:
    """graphc run's --media-dir and --media-urls as inputs.Sources (neither: a request's own bytes only)."""
    from pathlib import Path

    paths: bool | Path = False
    if media_dir is not None:
        paths = Path(media_dir).resolve()
        if not paths.is_dir():
            raise InvalidInput(f"--media-dir {media_dir} is not a folder", "", "name an existing folder")
    fetch = None
    if media_urls:
        from graphc.serve.fetch import Fetcher
        fetch = Fetcher()
    return Sources(paths=paths, urls=fetch)
