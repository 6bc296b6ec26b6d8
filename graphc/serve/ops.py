"""GET /v1/models, GET /health and GET /metrics: what is served, and how it is doing.

  /v1/models     the one model served, in OpenAI's list
  /health        {status, running, waiting, free_pages, pages} of the LLM's KV pool; when the plan speaks
                 also speaking, speech_free_pages and speech_pages (the speech lane's pool)
  /metrics       Prometheus text, from a registry of the app's own (several apps may share a process):
                 graphc_requests_total{kind, status}: finished requests by their kind and finish_reason
                   (stop, length, error, abort), and those the engine refused (status refused, kind unknown)
                 graphc_time_to_first_token_seconds, graphc_time_per_output_token_seconds,
                 graphc_first_audio_seconds: histograms, observed as each request finishes
                 graphc_kv_pages_used, graphc_kv_pages_free, graphc_requests_running, graphc_requests_waiting
                 graphc_walk_steps_total{walk}, graphc_node_steps_total{mode: replayed | eager},
                 graphc_preemptions_total: the engine's stats(), read when scraped
                 graphc_prefix_cache_queries_total, graphc_prefix_cache_hits_total (prompt rows looked up and
                 found: hits / queries is the hit rate), graphc_prefix_cache_pages, graphc_prefix_cache_idle_pages,
                 graphc_prefix_cache_evicted_pages_total, graphc_follow_cache_hits_total (with speech): the
                 prefix cache (graphc/runtime/prefix_cache.py), where the engine has one
                 graphc_media_cache_hits_total{node}, graphc_media_cache_misses_total{node},
                 graphc_media_cache_stored_bytes{node}: the plan's media caches (graphc/runtime/media_cache.py),
                 where it has any

The metrics see requests through the Driver's observers, called in the engine thread with each Event
(and with a finished Event when a client's abort frees a request). Scrapes and /health only read the
engine.
"""
from __future__ import annotations

import time

from graphc.serve.context import Context
from graphc.serve.errors import wrong_model

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

        load = self.engine.load()
        free, capacity = load["free_pages"], load["pages"]
        yield GaugeMetricFamily("graphc_kv_pages_free", "KV cache pages free", value=free)
        yield GaugeMetricFamily("graphc_kv_pages_used", "KV cache pages held by requests", value=capacity - free)
        yield GaugeMetricFamily("graphc_requests_running", "requests holding pages", value=load["running"])
        yield GaugeMetricFamily("graphc_requests_waiting", "requests waiting for pages", value=load["waiting"])
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
        yield from prefix_metrics(stats.get("prefix_cache"))
        yield from media_metrics(stats.get("media_cache", {}))


def prefix_metrics(cache: dict | None):
    """The prefix cache's rows looked up and found (their ratio is its hit rate), its pages, and the follow cache's
    rows taken, where the engine has them."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if cache is None:
        return
    yield CounterMetricFamily("graphc_prefix_cache_queries", "prompt rows admitted requests looked up in the prefix "
                              "cache", value=cache["query_rows"])
    yield CounterMetricFamily("graphc_prefix_cache_hits", "prompt rows taken from the prefix cache",
                              value=cache["hit_rows"])
    yield GaugeMetricFamily("graphc_prefix_cache_pages", "KV pages the prefix cache holds (shared or idle)",
                            value=cache["cached_pages"])
    yield GaugeMetricFamily("graphc_prefix_cache_idle_pages", "cached pages no request holds (counted free)",
                            value=cache["idle_pages"])
    yield CounterMetricFamily("graphc_prefix_cache_evicted_pages", "cached pages taken back for new rows",
                              value=cache["evicted_pages"])
    if "follow_rows" in cache:
        yield CounterMetricFamily("graphc_follow_cache_hits", "rows a speaking request's follow stage reads, taken "
                                  "from the follow cache", value=cache["follow_rows"]["hit_rows"])


def media_metrics(caches: dict):
    """The media caches' pieces found and not found, and the bytes of rows they hold, by encoder node."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    hits = CounterMetricFamily("graphc_media_cache_hits", "media pieces whose encoder rows came from the cache",
                               labels=["node"])
    misses = CounterMetricFamily("graphc_media_cache_misses", "media pieces the encoder ran with its cache on",
                                 labels=["node"])
    stored = GaugeMetricFamily("graphc_media_cache_stored_bytes", "bytes of encoder rows the cache holds",
                               labels=["node"])
    for node, c in caches.items():
        hits.add_metric([node], c["hits"])
        misses.add_metric([node], c["misses"])
        stored.add_metric([node], c["stored_bytes"])
    if caches:
        yield from (hits, misses, stored)


class Metrics:
    """The app's Prometheus registry: request counts and latencies (a Driver observer), and the engine's
    load and stats read at scrape time."""

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


def count_refusals(driver, metrics: Metrics) -> None:
    """Wrap driver.submit so that each submission the engine refuses is counted."""
    submit = driver.submit

    def counted(loop, kwargs):
        fut, events = submit(loop, kwargs)
        fut.add_done_callback(metrics.settled)
        return fut, events
    driver.submit = counted


def register(app, ctx: Context) -> None:
    """Add /health, /ping, /version, /v1/models (and /v1/models/{id}) and /metrics to `app`; the metrics observe
    the Driver's events."""
    from fastapi.responses import Response
    from prometheus_client import CONTENT_TYPE_LATEST

    @app.get("/health")
    def health():
        """The LLM's KV pages and requests; when the plan speaks, the requests still speaking and the speech
        lane's pages."""
        return {"status": "ok"} | ctx.engine.load()

    cards = {n: {"id": n, "object": "model", "created": 0, "owned_by": "graphc"} for n in ctx.names}

    @app.get("/v1/models")
    def models():
        """The served model, once under each of its names (--served-model-name)."""
        return {"object": "list", "data": list(cards.values())}

    @app.get("/v1/models/{model_id:path}")
    def model(model_id: str):
        """The served model's card under that name; another id is OpenAI's 404 (model_not_found)."""
        return wrong_model(model_id, ctx.names) or cards[model_id]

    @app.get("/version")
    def version():
        from graphc import __version__
        return {"version": __version__}

    def ping():
        """Liveness, as vLLM and SageMaker ask it: 200 while the server runs."""
        return Response(status_code=200)
    for method in ("GET", "POST"):                 # one route each: each its own OpenAPI operation id
        app.add_api_route("/ping", ping, methods=[method], operation_id=f"ping_{method.lower()}")

    metrics = Metrics(ctx.engine)
    app.state.metrics = metrics
    ctx.driver.observers.append(metrics.observe)
    count_refusals(ctx.driver, metrics)

    @app.get("/metrics", include_in_schema=False)
    def scrape():
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)
