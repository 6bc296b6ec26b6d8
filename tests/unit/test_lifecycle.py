"""`graphc run`'s server boots and stops as a user expects (issue 38): the boot prints a line per phase, then its
time; SIGTERM or SIGINT prints one line, a request in flight finishes within --shutdown-timeout (or ends with an
error event when the timeout is up), and the process exits 0 with no traceback; a second signal stops it at once
with one more line, no traceback, and the shell's code for the signal. A request naming no max_tokens stops at
--default-max-tokens."""
from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import ROOT
from tests.unit.test_examples import free_port, wait_healthy


def start(*extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "graphc.cli", "run", "plans/tiny_cpu.plan", "--random-weights",
                          "--port", str(port), *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    wait_healthy(p, port)
    return p, port


def stream(port: int, body: dict):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps({**body, "stream": True}).encode(),
                                 {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=60)


def events(resp) -> list:
    out = []
    for line in resp:
        line = line.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def stop(p: subprocess.Popen, sig: int | None, within: float) -> tuple[int, str, float]:
    """Send sig (None: it was sent), then wait for the exit: its code, its output, the seconds it took."""
    t0 = time.monotonic()
    if sig is not None:
        p.send_signal(sig)
    try:
        out, _ = p.communicate(timeout=within + 30)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        pytest.fail(f"graphc run still ran {within + 30:.0f} s after the signal: {out}")
    return p.returncode, out, time.monotonic() - t0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_lets_the_stream_in_flight_finish_then_exits_0_with_one_line(sig):
    p, port = start("--shutdown-timeout", "60")
    resp = stream(port, {"prompt": [1, 2, 3], "max_tokens": 40, "ignore_eos": True, "temperature": 0})
    first = resp.readline()                                   # the stream has begun: a request is in flight
    p.send_signal(sig)
    got = events(resp)
    code, out, _ = stop(p, None, 60)
    assert first.startswith(b"data: ")
    assert got[-1]["choices"][0]["finish_reason"] == "length", got[-1]
    assert code == 0 and "Traceback" not in out, out
    assert f"graphc run: {signal.Signals(sig).name}: stopping; requests in flight have 60 s to finish" in out, out


def test_when_the_timeout_is_up_the_stream_ends_with_an_error_event_and_the_server_exits_0():
    p, port = start("--shutdown-timeout", "0.5", "--default-max-tokens", "100000")
    resp = stream(port, {"prompt": [1, 2, 3], "ignore_eos": True, "temperature": 0})     # ~1,000 tokens: long
    resp.readline()
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    got = events(resp)
    code, out, _ = stop(p, None, 0.5)
    took = time.monotonic() - t0
    assert "error" in got[-1] and "shutting down" in got[-1]["error"]["message"], got[-1]
    assert code == 0 and "Traceback" not in out and took < 15, (took, out)


def test_a_request_naming_no_max_tokens_stops_at_the_servers_default():
    p, port = start("--default-max-tokens", "7")
    try:
        got = events(stream(port, {"prompt": [1, 2, 3], "ignore_eos": True, "temperature": 0,
                                   "stream_options": {"include_usage": True}}))
    finally:
        stop(p, signal.SIGTERM, 30)
    assert got[-1]["usage"]["completion_tokens"] == 7, got[-1]


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_stops_at_once_with_one_line_and_no_traceback(sig, code):
    p, port = start("--shutdown-timeout", "60", "--default-max-tokens", "100000")
    resp = stream(port, {"prompt": [1, 2, 3], "ignore_eos": True, "temperature": 0})     # ~1,000 tokens: long
    resp.readline()
    # a request whose body never comes: it holds its connection until the server stops without waiting
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000\r\n\r\n{\"prompt\"")
    p.send_signal(sig)
    time.sleep(0.5)
    t0 = time.monotonic()
    p.send_signal(sig)
    got = events(resp)
    status, out, _ = stop(p, None, 10)
    took = time.monotonic() - t0
    stalled.close()
    name = signal.Signals(sig).name
    assert status == code and took < 10 and "Traceback" not in out, (status, took, out)
    assert out.split("serving on ")[1].splitlines()[1:] == [
        f"graphc run: {name}: stopping; requests in flight have 60 s to finish",
        f"graphc run: {name} again: stopping now; requests in flight end with an error"], out
    assert "error" in got[-1] and "stopping now" in got[-1]["error"]["message"], got[-1]


def test_the_boot_prints_a_line_per_phase_then_its_time():
    """Not a terminal: lines, no bars. The plan's weights are encoder 799.50 KiB + decoder 418.50 KiB = 1.19 MiB,
    and its walks have 33 rungs in all (plans/tiny_cpu.plan)."""
    p, _ = start()
    _, out, _ = stop(p, signal.SIGTERM, 30)
    boot = out.split("graphc run: ")[0].splitlines()
    assert re.fullmatch(r"boot: weights: 1\.19 MiB seeded in \d+\.\d s \([\d.]+ (KiB|MiB)/s\)", boot[0]), out
    assert re.fullmatch(r"boot: warm-up: 33 steps run in \d+\.\d s", boot[1]), out
    took = re.fullmatch(r"boot: done in (\d+\.\d) s", boot[2])
    assert len(boot) == 3 and took, out
    assert f"booted in {took[1]} s" in out.split("graphc run: ")[1], out
