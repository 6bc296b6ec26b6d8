"""`graphc run --served-model-name A B` answers to either name and carries the first (issue 38); an
X-Request-Id header is echoed, becomes the base of the response's id and shows in the access log; a malformed
one is a 400. Against the `graphc run` process itself, on the tiny cpu plan."""
from __future__ import annotations

import json
import signal
import urllib.request
from urllib.error import HTTPError

from tests.unit.test_lifecycle import start, stop


def call(port: int, path: str, body: dict | None = None, headers: dict | None = None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode() if body else None,
                                 {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def test_served_names_and_request_ids():
    p, port = start("--served-model-name", "alpha", "org/beta", "--access-log")
    try:
        _, _, models = call(port, "/v1/models")
        done = call(port, "/v1/completions", {"model": "org/beta", "prompt": [1, 2], "max_tokens": 2},
                    {"X-Request-Id": "trace-7:a"})
        other = call(port, "/v1/completions", {"model": "gamma", "prompt": [1, 2], "max_tokens": 2})
        card = call(port, "/v1/models/org/beta")
        bad = call(port, "/v1/completions", {"prompt": [1, 2], "max_tokens": 2}, {"X-Request-Id": "no spaces"})
    finally:
        _, out, _ = stop(p, signal.SIGTERM, 30)
    assert [m["id"] for m in models["data"]] == ["alpha", "org/beta"]
    status, headers, body = done
    assert status == 200 and body["model"] == "alpha" and body["id"] == "cmpl-trace-7:a"
    assert headers.get("x-request-id") == "trace-7:a"
    assert other[0] == 404 and "'alpha' or 'org/beta'" in other[2]["error"]["message"]
    assert card[0] == 200 and card[2]["id"] == "org/beta"
    assert bad[0] == 400 and bad[2]["error"]["param"] == "X-Request-Id"
    logged = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert any(r["path"] == "/v1/completions" and r["request_id"] == "trace-7:a" for r in logged), out
