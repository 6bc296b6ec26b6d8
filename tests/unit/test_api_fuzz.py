"""Fuzzing the API (issue 15): schemathesis reads the server's own /openapi.json and sends what it
generates from it, schema-valid (positive) and schema-breaking (negative) bodies, to a tiny Qwen3-Omni on
loopback. Every response must be no 500, documented (status, content type, body schema), and negative
data refused with a 4xx. Bounded: a few dozen examples an operation and mode, small max_tokens; once the
fuzzing is over the engine holds nothing (the leak oracle)."""
import json

import pytest
from hypothesis import HealthCheck, given, settings

from graphc.runtime.engine import Engine
from tests.unit.loopback import serve

schemathesis = pytest.importorskip("schemathesis")
EXAMPLES = 50


@pytest.fixture(scope="module")
def api(tiny_omni_dir):
    d = tiny_omni_dir
    engine = Engine(d / "p.plan", checkpoint=d / "ckpt")
    server, port = serve(engine)
    schema = schemathesis.openapi.from_url(f"http://127.0.0.1:{port}/openapi.json")
    yield schema, engine, f"http://127.0.0.1:{port}"
    server.should_exit = True


def cap(case):
    """Keep a generated valid request small: at most 4 tokens to generate, no stream held open."""
    if isinstance(case.body, dict):
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(case.body.get(key), int) and not isinstance(case.body.get(key), bool) and case.body[key] > 4:
                case.body[key] = 4
        if isinstance(case.body.get("max_frames"), int) and case.body["max_frames"] > 8:
            case.body["max_frames"] = 8
    return case


OPERATIONS = [("/v1/chat/completions", "POST"), ("/v1/completions", "POST"), ("/v1/audio/speech", "POST"),
              ("/v1/models", "GET"), ("/health", "GET")]


CALLS = [(path, method, mode) for path, method in OPERATIONS
         for mode in (["positive", "negative"] if method == "POST" else ["positive"])]   # a GET takes nothing to break


@pytest.mark.parametrize("path, method, mode", CALLS)
def test_every_answer_is_documented_and_none_is_a_500(api, path, method, mode, leak_oracle):
    schema, engine, base = api
    leak_oracle.watch(engine)
    op = schema[path][method]
    strategy = op.as_strategy(generation_mode=schemathesis.GenerationMode(mode))

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        case = cap(case)
        response = case.call(base_url=base, timeout=60)
        assert response.status_code < 500, (json.dumps(case.body), response.status_code, response.text[:300])
        case.validate_response(response, excluded_checks=[schemathesis.checks.positive_data_acceptance])
    run()


def test_the_schema_documents_every_route_and_its_errors(api):
    schema, _, _ = api
    raw = schema.raw_schema
    for path, method in OPERATIONS[:3]:
        responses = raw["paths"][path][method.lower()]["responses"]
        assert {"200", "400", "429"} <= set(responses), (path, sorted(responses))
        assert "422" not in responses           # validation errors are 400 here, in OpenAI's body


def test_found_by_fuzzing_max_tokens_null_beside_max_completion_tokens(api):
    """Was a 500: the null max_tokens and max_completion_tokens both reached SamplingParams."""
    import requests

    _, engine, base = api
    r = requests.post(base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                          "max_tokens": None, "max_completion_tokens": 2}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2
