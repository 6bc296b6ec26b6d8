"""Running graphc run's server: Prometheus metrics, a JSON access log, an API key.

install() adds them (and POST /v1/audio/transcriptions, graphc/serve/transcribe.py) to build_app's app:

  GET /metrics   Prometheus text, from a registry of the app's own (several apps may share a process):
                 graphc_requests_total{kind, status}: finished requests by their kind and finish_reason
                   (stop, length, error, abort), and those the engine refused (status refused, kind unknown)
                 graphc_time_to_first_token_seconds, graphc_time_per_output_token_seconds,
                 graphc_first_audio_seconds: histograms, observed as each request finishes
                 graphc_kv_pages_used, graphc_kv_pages_free, graphc_requests_running, graphc_requests_waiting
                 graphc_walk_steps_total{walk}, graphc_node_steps_total{mode: replayed | eager},
                 graphc_preemptions_total: the engine's stats(), read when scraped
  access log     one JSON line per HTTP request on the `graphc.access` logger: method, path, status,
                 duration_ms, request_id (the X-Request-Id header, when sent) and client
  api key        every route but /health wants `Authorization: Bearer KEY` (/metrics, /openapi.json and
                 /docs too), else 401 in OpenAI's error body (code invalid_api_key); /health stays open

The metrics see requests through the Driver's observers, called in the engine thread with each Event
(and with a finished Event when a client's abort frees a request). Scrapes only read the engine.
"""
from __future__ import annotations

import hmac
import json
import logging
import sys
import time

from graphc.serve.transcribe import DEFAULT_MAX_AUDIO_BYTES

ACCESS = logging.getLogger("graphc.access")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5)


def read_stats(engine, tries: int = 5) -> dict:
    """engine.stats() from another thread: a step that adds a walk or rung while it is read makes the
    read fail ('dictionary changed size'); read again."""
    for i in range(tries):
        try:
            return engine.stats()
        except RuntimeError:
            if i == tries - 1:
                raise
            time.sleep(0.001)
    raise AssertionError("unreachable")


class EngineCollector:
    """What the engine holds and has run, read at scrape time."""

    def __init__(self, engine):
        self.engine = engine

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.engine.scheduler
        free, capacity = s.pages.num_free, s.capacity
        yield GaugeMetricFamily("graphc_kv_pages_free", "KV cache pages free", value=free)
        yield GaugeMetricFamily("graphc_kv_pages_used", "KV cache pages held by requests", value=capacity - free)
        yield GaugeMetricFamily("graphc_requests_running", "requests holding pages", value=len(s.running))
        yield GaugeMetricFamily("graphc_requests_waiting", "requests waiting for pages", value=len(s.waiting))
        stats = read_stats(self.engine)
        walks = CounterMetricFamily("graphc_walk_steps", "engine steps run, by walk", labels=["walk"])
        for walk, n in stats["steps"].items():
            walks.add_metric([walk], n)
        yield walks
        nodes = CounterMetricFamily("graphc_node_steps", "node steps: a captured graph replayed, or run eagerly",
                                    labels=["mode"])
        nodes.add_metric(["replayed"], stats["replayed"])
        nodes.add_metric(["eager"], stats["eager"])
        yield nodes
        yield CounterMetricFamily("graphc_preemptions", "requests preempted (recomputed)", value=stats["preemptions"])


class Metrics:
    def __init__(self, engine):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter("graphc_requests", "requests by kind and how they ended", ["kind", "status"],
                                registry=r)
        self.ttft = Histogram("graphc_time_to_first_token_seconds", "arrival to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("graphc_time_per_output_token_seconds", "first token to the last, per later token",
                              buckets=TOKEN_BUCKETS, registry=r)
        self.first_audio = Histogram("graphc_first_audio_seconds", "arrival to first audio out",
                                     buckets=LATENCY_BUCKETS, registry=r)
        r.register(EngineCollector(engine))

    def observe(self, ev) -> None:
        """A Driver observer (engine thread): count and time each request as it finishes."""
        if not ev.finished:
            return
        req = ev.request
        self.requests.labels(req.kind, req.finish_reason or "error").inc()
        t = req.times
        if "first_token" in t:
            self.ttft.observe(t["first_token"] - t["arrived"])
            end = t.get("text_finished", t.get("finished"))      # a speaking request's text ends before its audio
            if end is not None and len(req.output) > 1:
                self.tpot.observe((end - t["first_token"]) / (len(req.output) - 1))
        if "first_audio" in t:
            self.first_audio.observe(t["first_audio"] - t["arrived"])

    def settled(self, fut) -> None:
        """A submission's future: the engine refused it when it holds an exception."""
        if not fut.cancelled() and fut.exception() is not None:
            self.requests.labels("unknown", "refused").inc()

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


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


class ApiKey:
    """ASGI middleware: every route but /health wants `Authorization: Bearer KEY`; a 401 in OpenAI's body
    otherwise."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and path != "/health":
            auth = dict(scope.get("headers") or []).get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if not auth:
                message = "no API key: send the header 'Authorization: Bearer KEY'"
            elif scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                message = "the API key is not this server's"
            else:
                return await self.app(scope, receive, send)
            from fastapi.responses import JSONResponse

            resp = JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                           "code": "invalid_api_key"}}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
            return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


def install(app, engine, driver, model_name: str, *, api_key: str | None = None, access_log: bool = False,
            max_audio_bytes: int = DEFAULT_MAX_AUDIO_BYTES) -> None:
    """Metrics (as a Driver observer), /metrics, the transcription route, and the optional key and log."""
    from fastapi.responses import Response
    from prometheus_client import CONTENT_TYPE_LATEST

    from graphc.serve.transcribe import register

    metrics = Metrics(engine)
    app.state.metrics = metrics
    driver.observers.append(metrics.observe)
    submit = driver.submit

    def counted(loop, kwargs):
        fut, events = submit(loop, kwargs)
        fut.add_done_callback(metrics.settled)
        return fut, events
    driver.submit = counted

    @app.get("/metrics", include_in_schema=False)
    def scrape():
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    register(app, engine, driver, model_name, max_audio_bytes)
    if api_key:
        app.add_middleware(ApiKey, key=api_key)
    if access_log:
        app.add_middleware(AccessLog)        # added last, so outermost: refused keys are logged too


def access_log_to_stderr() -> None:
    """graphc run --access-log: the JSON lines, as they are, on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    ACCESS.addHandler(handler)
    ACCESS.setLevel(logging.INFO)
    ACCESS.propagate = False
