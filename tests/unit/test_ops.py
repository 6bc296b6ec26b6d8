"""graphc run's server in operation, on a tiny Qwen3-ASR checkpoint: /metrics counts requests by kind and
how they ended and shows the engine's steps, the API key guards every route but /health and /ping, the access log writes one
JSON line a request, and `graphc run` passes its flags (and GRAPHC_API_KEY) on."""
import base64
import json
import logging
import re
import time
import urllib.request
from urllib.error import HTTPError

import pytest

from tests.unit.loopback import serve
from tests.unit.test_transcribe import tiny_asr, wait_idle

openai = pytest.importorskip("openai")
pytest.importorskip("prometheus_client")

KEY = "sekrit-key"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("ops")
    engine = tiny_asr(d)
    server, port = serve(engine, api_key=KEY, access_log=True)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=60)
    audio = base64.b64encode((d / "ckpt" / "sample.wav").read_bytes()).decode()
    messages = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}}]}]
    yield dict(engine=engine, client=client, port=port, dir=d, messages=messages, app=server.config.app)
    server.should_exit = True


def get(port: int, path: str, headers: dict | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})) as r:
            return r.status, r.read()
    except HTTPError as e:
        return e.code, e.read()


def scrape(port: int) -> dict:
    """/metrics as {(name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    status, text = get(port, "/metrics", {"Authorization": "Bearer " + KEY})
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text.decode()) for s in fam.samples}


def count(m: dict, kind: str, status: str) -> float:
    return m.get(("graphc_requests_total", (("kind", kind), ("status", status))), 0.0)


def test_metrics_count_requests_by_kind_and_end_and_show_the_engines_steps(served):
    c, engine, port = served["client"], served["engine"], served["port"]
    name, msgs = engine.plan.model.name, served["messages"]
    before = scrape(port)
    r = c.chat.completions.create(model=name, messages=msgs, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    r = c.chat.completions.create(model=name, messages=msgs, max_tokens=3, temperature=0,
                                  extra_body={"stop_token_ids": list(range(512))})     # its first token stops it
    assert r.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError, match="the plan allows"):
        c.chat.completions.create(model=name, messages=msgs, max_tokens=5000)
    stream = c.chat.completions.create(model=name, messages=msgs, max_tokens=1500, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    it = iter(stream)
    next(it), next(it)                            # the role, then a token: then the client goes away
    stream.close()
    assert wait_idle(engine)
    for _ in range(100):                          # the abort is counted in the engine thread as it frees the pages
        after = scrape(port)
        if count(after, "a2t", "abort") > count(before, "a2t", "abort"):
            break
        time.sleep(0.02)
    assert {s: count(after, k, s) - count(before, k, s) for k, s in
            [("a2t", "length"), ("a2t", "stop"), ("a2t", "abort"), ("a2t", "error"), ("unknown", "refused")]} == \
        {"length": 1, "stop": 1, "abort": 1, "error": 0, "refused": 1}
    ttft = ("graphc_time_to_first_token_seconds_count", ())
    assert after[ttft] - before.get(ttft, 0) == 3
    assert after[("graphc_time_per_output_token_seconds_count", ())] >= 1
    stats = engine.stats()
    for walk, n in stats["steps"].items():
        assert after[("graphc_walk_steps_total", (("walk", walk),))] == n
    assert after[("graphc_node_steps_total", (("mode", "replayed"),))] == stats["replayed"]
    assert after[("graphc_node_steps_total", (("mode", "eager"),))] == stats["eager"] > 0
    assert after[("graphc_kv_pages_free", ())] == engine.scheduler.capacity
    assert after[("graphc_kv_pages_used", ())] == 0


def test_metrics_show_the_prefix_cache(served):
    """The same request twice: the second takes its prompt's first pages from the cache (the first may too, after
    the other tests). Queries count both prompts' rows, hits their cached tokens (both from their usage); the
    gauges are the engine's."""
    c, engine, port = served["client"], served["engine"], served["port"]
    before = scrape(port)
    got = [c.chat.completions.create(model=engine.plan.model.name, messages=served["messages"], max_tokens=2,
                                     temperature=0) for _ in range(2)]
    assert wait_idle(engine)
    after = scrape(port)

    def delta(name):
        return after[(name, ())] - before.get((name, ()), 0.0)
    cached = got[1].usage.prompt_tokens_details.cached_tokens
    assert delta("graphc_prefix_cache_queries_total") == got[0].usage.prompt_tokens + got[1].usage.prompt_tokens
    assert delta("graphc_prefix_cache_hits_total") == got[0].usage.prompt_tokens_details.cached_tokens + cached
    assert cached > 0
    st = engine.stats()["prefix_cache"]
    assert after[("graphc_prefix_cache_pages", ())] == st["cached_pages"] >= cached // engine.scheduler.kv.page_size
    assert after[("graphc_prefix_cache_idle_pages", ())] == st["idle_pages"] == st["cached_pages"]    # none held
    assert ("graphc_follow_cache_hits_total", ()) not in after                                     # no speech


def test_the_api_key_guards_every_route_but_health(served):
    port, c, name = served["port"], served["client"], served["engine"].plan.model.name
    status, body = get(port, "/v1/models")
    err = json.loads(body)["error"]
    assert status == 401 and err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
    assert get(port, "/v1/models", {"Authorization": "Bearer " + KEY})[0] == 200
    assert get(port, "/v1/models", {"Authorization": "Basic " + KEY})[0] == 401
    wrong = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="not-it", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="not this server's") as e:
        wrong.audio.transcriptions.create(model=name, file=open(served["dir"] / "ckpt" / "sample.wav", "rb"))
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    assert [m.id for m in c.models.list()] == [name]
    assert get(port, "/health")[0] == 200 and get(port, "/ping")[0] == 200
    for path in ("/metrics", "/openapi.json", "/docs", "/nowhere", "/health/", "/v1", "/version", "/v1/models/x"):
        assert get(port, path)[0] == 401, path
    assert get(port, "/openapi.json", {"Authorization": "Bearer " + KEY})[0] == 200


def test_the_access_log_writes_one_json_line_a_request(served, caplog):
    port = served["port"]
    with caplog.at_level(logging.INFO, logger="graphc.access"):
        get(port, "/health", {"X-Request-Id": "abc-123"})
        get(port, "/v1/models", {"X-Request-Id": "def-456"})

        def mine() -> list[dict]:
            # a line is written once its response has gone (after the client has it), and an earlier test's
            # request can be logged late: this test's lines, by request id
            return sorted((x for r in caplog.records if r.name == "graphc.access"
                           for x in [json.loads(r.getMessage())] if x["request_id"] in ("abc-123", "def-456")),
                          key=lambda x: x["request_id"])
        for _ in range(500):
            if len(mine()) >= 2:
                break
            time.sleep(0.01)
        time.sleep(0.05)                          # a third line, were one written, would come by now
        lines = mine()
    assert [(x["method"], x["path"], x["status"], x["request_id"]) for x in lines] == \
        [("GET", "/health", 200, "abc-123"), ("GET", "/v1/models", 401, "def-456")]
    assert all(x["client"].startswith("127.0.0.1:") and x["duration_ms"] >= 0 for x in lines)


def test_a_failing_observer_does_not_stop_the_engine(served):
    c, engine, driver = served["client"], served["engine"], served["app"].state.driver

    def broken(ev):
        raise ValueError("observer bug")
    driver.observers.insert(0, broken)
    try:
        r = c.chat.completions.create(model=engine.plan.model.name, messages=served["messages"], max_tokens=2,
                                      temperature=0, extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "length"
    finally:
        driver.observers.remove(broken)


def test_graphc_run_passes_its_flags_and_the_env_key(served, monkeypatch):
    import graphc.runtime.engine
    import graphc.serve
    from graphc.cli import main

    calls = []

    class Booted:
        def __init__(self, *a, **k):
            pass

        def summary(self):
            return "booted"

        def close(self):
            calls.append("closed")
    monkeypatch.setattr(graphc.runtime.engine, "Engine", Booted)
    monkeypatch.setattr(graphc.serve, "serve", lambda engine, host, port, **kw: calls.append(kw))
    plan = str(served["dir"] / "p.plan")
    monkeypatch.setenv("GRAPHC_API_KEY", "from-env")
    assert main(["run", plan]) == 0
    defaults = {"max_waiting": None, "gather_ms": None, "media_dir": None, "media_urls": False, "shutdown_timeout": 30.0,
                "served_model_name": None, "trust_request_chat_template": False, "max_realtime_sessions": 64,
                "realtime_idle_timeout": 600.0}
    assert calls[-2:] == [{"api_key": "from-env", "access_log": False, "max_audio_bytes": 25 * 1024 * 1024,
                           **defaults}, "closed"]
    assert main(["run", plan, "--api-key", "flag", "--access-log", "--max-upload-mb", "1.5", "--max-waiting", "7",
                 "--media-dir", str(served["dir"]), "--media-urls", "--shutdown-timeout", "2.5",
                 "--served-model-name", "a", "b", "--max-realtime-sessions", "5", "--realtime-idle-timeout", "9",
                 "--gather-ms", "20"]) == 0
    assert calls[-2] == {"api_key": "flag", "access_log": True, "max_audio_bytes": 1536 * 1024, "max_waiting": 7,
                         "gather_ms": 20.0,
                         "media_dir": str(served["dir"]), "media_urls": True, "shutdown_timeout": 2.5,
                         "served_model_name": ["a", "b"], "trust_request_chat_template": False,
                         "max_realtime_sessions": 5, "realtime_idle_timeout": 9.0}
    monkeypatch.delenv("GRAPHC_API_KEY")
    assert main(["run", plan]) == 0 and calls[-2]["api_key"] is None
    assert main(["run", plan, "--max-upload-mb", "0"]) == 2 and len(calls) == 6
    assert main(["run", plan, "--max-waiting", "0"]) == 2 and len(calls) == 6
    assert main(["run", plan, "--gather-ms", "-1"]) == 2 and main(["run", plan, "--gather-ms", "20000"]) == 2
    assert len(calls) == 6
    assert main(["run", plan, "--media-dir", str(served["dir"] / "nope")]) == 2 and len(calls) == 6
    assert main(["run", plan, "--shutdown-timeout", "-1"]) == 2 and len(calls) == 6
    assert main(["run", plan, "--served-model-name", "a", "a"]) == 2 and len(calls) == 6
    assert main(["run", plan, "--realtime-idle-timeout", "0"]) == 2 and len(calls) == 6


def test_every_route_is_in_the_openapi_schema(served):
    """/openapi.json describes every route the app serves, the transcription form and /metrics included
    (issue 38), each with the methods it answers; /docs and the schema itself excepted."""
    status, raw = get(served["port"], "/openapi.json", {"Authorization": "Bearer " + KEY})
    paths = json.loads(raw)["paths"]
    own = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
    routes = {(re.sub(r":\w+}", "}", r.path), m.lower()) for r in served["app"].routes if r.path not in own
              for m in (getattr(r, "methods", None) or ()) if m != "HEAD"}
    documented = {(p, m) for p, ops in paths.items() for m in ops}
    assert status == 200 and routes <= documented, sorted(routes - documented)
    form = paths["/v1/audio/transcriptions"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["required"] == ["file"] and "401" in paths["/metrics"]["get"]["responses"]
