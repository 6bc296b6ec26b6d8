"""`graphc run` on a two-device CPU plan, offline (issue 12), and a plan device's worker killed mid-run: the
requests in flight fail, the engine names the device within 10 s and stops; nothing hangs. A module of
its own: one process drives one multi-device plan at a time (test_multi_device.py holds one open)."""
import json
import os
import signal
import time

import numpy as np
import pytest

from graphc.cli import main
from graphc.runtime.engine import Engine
from graphc.serving import Media
from graphc.runtime.sampler import SamplingParams
from graphc.runtime.workers import WorkerDied
from tests.parity.test_multi_device import plans  # noqa: F401  (the fixture)


def test_a_killed_worker_fails_the_requests_in_flight_and_names_its_device(plans, leak_oracle):
    engine = leak_oracle.watch(Engine(plans[1], random_weights=True))
    try:
        m = engine.host.media
        clip = np.zeros(16000, dtype=np.float32)
        reqs = [engine.add(prompt_token_ids=[1, 2, 3], params=SamplingParams(temperature=0, max_tokens=50)),
                engine.add(prompt_token_ids=[1, m.audio_start_token_id, m.audio_token_id, engine.host.audio_end],
                           media=[Media("audio", clip)], params=SamplingParams(temperature=0, max_tokens=50))]
        engine.step()
        kill_and_see_it_stop(engine, reqs)
    finally:
        engine.close()


def kill_and_see_it_stop(engine: Engine, reqs: list) -> None:
    """SIGKILL device 0's worker and step: WorkerDied naming it within 10 s, every request in flight ended
    with that error (each event delivered), the engine dead and holding nothing."""
    os.kill(engine.workers.links[0].proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerDied, match="device 0") as e:
        while engine.has_work():
            engine.step()
    assert time.monotonic() - t0 < 10
    assert {ev.request.id for ev in e.value.events} == {r.id for r in reqs}
    assert all(r.closed and r.finish_reason == "error" and "device 0" in r.error for r in reqs)
    assert engine.dead and not engine.has_work()


def test_a_worker_killed_while_its_talker_speaks_stops_the_engine(plans, leak_oracle):
    """The talker and Code2Wav live on the worker (speech across devices): a kill after the first frame ends
    the run with WorkerDied naming device 0 (not one request failed and the engine going on without them)."""
    from graphc.runtime.speech import SpeechParams

    engine = leak_oracle.watch(Engine(plans[1], random_weights=True))
    try:
        ids = engine.host.speech.ids
        prompt = [ids["im_start_token_id"], ids["user_token_id"], 5, 6, ids["im_start_token_id"], ids["assistant_token_id"]]
        speaking = engine.add(prompt_token_ids=prompt, params=SamplingParams(temperature=0, max_tokens=60, ignore_eos=True),
                              speech=SpeechParams(temperature=0, max_frames=200))
        text = engine.add(prompt_token_ids=[1, 2, 3], params=SamplingParams(temperature=0, max_tokens=60))
        while not speaking.speech.frames:
            engine.step()
        kill_and_see_it_stop(engine, [speaking, text])
    finally:
        engine.close()


def test_graphc_run_serves_a_two_device_plan_offline(plans, tmp_path):
    reqs = tmp_path / "in.jsonl"
    reqs.write_text("".join(json.dumps({"id": f"r{i}", "prompt_token_ids": [1 + i, 2, 3], "max_tokens": 5,
                                        "temperature": 0}) + "\n" for i in range(3)))
    out, stats = tmp_path / "out.jsonl", tmp_path / "stats.json"
    assert main(["run", str(plans[1]), "--random-weights", "--requests", str(reqs), "--output", str(out),
                 "--stats", str(stats)]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["id"] for x in lines] == ["r0", "r1", "r2"] and all(len(x["token_ids"]) == 5 for x in lines)
    st = json.loads(stats.read_text())
    assert st["remote"]["steps"] == 0          # text only: nothing ran on device 0
    # each device's boot against its ledger, the worker's (device 0) reported from its own process
    assert sorted(st["devices"]) == ["0", "1"] and all(c["ok"] and c["graphs_planned"] == 0
                                                       for c in st["devices"].values())


def _serve(plan, *extra: str):
    """`graphc run PLAN --random-weights [extra]` on a free loopback port, up: (its process, the port)."""
    import socket
    import subprocess
    import sys
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "graphc.cli", "run", str(plan), "--random-weights",
                               "--port", str(port), *extra], stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return server, port
        except OSError:
            if server.poll() is not None or time.monotonic() - t0 > 180:
                server.kill()
                raise AssertionError("the server did not start") from None
            time.sleep(0.5)


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def test_the_server_answers_what_is_in_flight_and_exits_3_when_a_worker_dies(plans):
    """`graphc run` serving the two-device plan: its worker killed while a request decodes; the request gets
    its answer (an error naming the device), and the server exits 3 within 10 s."""
    import threading
    import urllib.request

    server, port = _serve(plans[1])
    try:
        workers = _children(server.pid)
        assert len(workers) == 1
        got = {}

        def ask():
            body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 1000, "temperature": 0, "ignore_eos": True}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    got["body"] = json.loads(r.read())
            except urllib.error.HTTPError as e:
                got["body"] = json.loads(e.read())
            except OSError as e:
                got["error"] = e

        asker = threading.Thread(target=ask)
        asker.start()
        time.sleep(1.0)                                   # it is decoding
        os.kill(workers[0], signal.SIGKILL)
        t0 = time.monotonic()
        assert server.wait(timeout=10) == 3
        assert time.monotonic() - t0 < 10
        asker.join(timeout=10)
        assert "device 0" in json.dumps(got.get("body")), got
        assert "device 0" in server.stderr.read()
    finally:
        if server.poll() is None:
            server.kill()


def test_an_idle_server_exits_3_when_a_worker_dies(plans):
    """Nothing in flight: the server still sees its device's worker die, and exits 3 naming it."""

    server, port = _serve(plans[1])
    try:
        (worker,) = _children(server.pid)
        os.kill(worker, signal.SIGKILL)
        assert server.wait(timeout=10) == 3
        assert "device 0" in server.stderr.read()
    finally:
        if server.poll() is None:
            server.kill()
