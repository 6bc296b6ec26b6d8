"""Saturation (issue 15): four times more requests than the tiny plan's pools can hold at once are queued
and served, each kind in order of arrival, none hangs; the bounded queue refuses the rest at once with
429, OpenAI's body and Retry-After. The engine's first step is held until every request has been sent,
so which are queued and which refused does not depend on how fast the engine runs."""
import base64
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from graphc.runtime.engine import Engine
from tests.unit.loopback import post_json, serve

PROMPT = "hello world, how are you today?"
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def plan(tiny_omni_dir):
    return tiny_omni_dir


def body(i: int, audio: str) -> dict:
    """Even i: text; odd i: audio and text (two kinds, t2t and a2t)."""
    content = PROMPT if i % 2 == 0 else [{"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}},
                                         {"type": "text", "text": PROMPT}]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "user": str(i)}


def test_four_times_what_the_pools_hold_is_served_in_order_and_the_rest_refused(plan, leak_oracle, tmp_path):
    import numpy as np
    import soundfile as sf

    engine = leak_oracle.watch(Engine(plan / "p.plan", checkpoint=plan / "ckpt"))
    s = engine.scheduler
    wave = (0.2 * np.sin(np.arange(16000) / 16000 * 2 * np.pi * 220)).astype(np.float32)
    sf.write(tmp_path / "a.wav", wave, 16000)
    audio = base64.b64encode((tmp_path / "a.wav").read_bytes()).decode()
    rows = len(engine.add(messages=body(1, audio)["messages"], request_id="probe").prompt.ids) + MAX_TOKENS
    engine.abort("probe")
    hold = min(s.max_running, s.capacity // s.kv.pages_for(rows))       # requests the pools hold at once
    queued, extra = 4 * hold, 6
    go = threading.Event()
    step = engine.step

    def held_step():
        go.wait(60)
        return step()
    engine.step = held_step
    order = []
    server, port = serve(engine, max_waiting=queued)
    server.config.app.state.driver.observers.append(
        lambda ev: ev.finished and order.append((ev.request.kind, ev.request.arrival, ev.request.times.get("first_token"))))

    driver = server.config.app.state.driver
    try:
        with ThreadPoolExecutor(queued + extra) as pool:
            futures = [pool.submit(post_json, port, "/v1/chat/completions", body(i, audio))
                       for i in range(queued + extra)]
            t = time.monotonic()
            while time.monotonic() - t < 60:              # every request queued or answered, the engine held
                if driver.waiting() + sum(f.done() for f in futures) == queued + extra:
                    break
                time.sleep(0.05)
            go.set()
            answers = [f.result(timeout=120) for f in futures]           # none hangs
    finally:
        go.set()
        server.should_exit = True
    codes = sorted(code for code, _, _ in answers)
    assert codes == [200] * queued + [429] * extra
    for code, out, headers in answers:
        if code == 429:
            err = out["error"]
            assert err["code"] == "rate_limit_exceeded" and err["type"] == "requests"
            assert f"at most {queued} may" in err["message"] and "--max-waiting" in err["message"]
            assert int(headers["retry-after"]) >= 1
        else:
            assert out["usage"]["completion_tokens"] == MAX_TOKENS and out["choices"][0]["finish_reason"] == "length"
    assert len(order) == queued
    for kind in ("t2t", "a2t"):
        mine = sorted((arrival, first) for k, arrival, first in order if k == kind)
        assert len(mine) >= hold
        firsts = [first for _, first in mine]
        assert firsts == sorted(firsts), f"{kind} requests did not start in order of arrival"


def test_a_failing_step_fails_what_is_in_flight_and_ends_the_server(plan, leak_oracle):
    """A step that raises (a bug) must not leave the engine thread dead and its clients waiting forever."""
    engine = leak_oracle.watch(Engine(plan / "p.plan", checkpoint=plan / "ckpt"))
    step, died = engine._step, []

    def broken():
        if engine.scheduler.running:
            raise RuntimeError("planted")
        return step()
    engine._step = broken
    server, port = serve(engine, on_death=died.append)
    try:
        code, out, _ = post_json(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4})
    finally:
        server.should_exit = True
    assert code == 500 and "the engine's step failed (RuntimeError: planted)" in out["error"]["message"]
    assert out["error"]["type"] == "server_error"
    for _ in range(500):                       # the engine thread ends the server right after it sent the errors
        if died:
            break
        time.sleep(0.01)
    assert len(died) == 1 and died[0].exit_code == 3


def test_the_engine_thread_stops_with_the_server(plan):
    engine = Engine(plan / "p.plan", checkpoint=plan / "ckpt")
    server, port = serve(engine)
    driver = server.config.app.state.driver
    assert post_json(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                                   "max_tokens": 2})[0] == 200
    server.should_exit = True
    driver.thread.join(10)
    assert not driver.thread.is_alive()          # the engine is its owner's again: nothing else steps it
    assert engine.generate([{"prompt_token_ids": [5, 6, 7], "max_tokens": 2}])[0].finish_reason == "length"
