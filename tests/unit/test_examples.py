"""The user-facing examples run as README.md and examples/README.md say, each in a process of its own, on the
tiny Qwen3-Omni checkpoint (tests/conftest.py's tiny_omni_dir) or a CPU plan: examples/python_api.py,
examples/openai_client.py against `graphc run` on loopback, and examples/declare_model.py planned by
`graphc plan` and then served. Each test takes well under a minute on 2 cores."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import ROOT

GRAPHC = [sys.executable, "-m", "graphc.cli"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
# python_api.py's line per request: "ID: KIND, N prompt tokens -> M tokens (REASON): TEXT"
OUT_LINE = re.compile(r"^(?P<id>[\w-]+): (?P<kind>\w+), (?P<prompt>\d+) prompt tokens -> (?P<n>\d+) tokens "
                      r"\((?P<reason>\w+)\): (?P<what>.*)$")


def run(args: list[str], timeout: float = 120) -> str:
    """Run a command at the repo root; its stdout, after asserting exit 0."""
    done = subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def outputs(stdout: str) -> dict[str, dict]:
    return {m["id"]: m.groupdict() for m in map(OUT_LINE.match, stdout.splitlines()) if m}


def test_python_api_on_the_tiny_checkpoint(tiny_omni_dir):
    """Chat messages and a plain prompt through the checkpoint's tokenizer: every request t2t, its prompt
    tokenized, max_tokens generated, text printed."""
    d = tiny_omni_dir
    out = run([sys.executable, "examples/python_api.py", str(d / "p.plan"), "--checkpoint", str(d / "ckpt"),
               "--max-tokens", "4"])
    assert out.startswith("graphc run: qwen3_omni-tiny-checkpoint on cpu x1")
    got = outputs(out)
    assert sorted(got) == ["chat", "prompt", "sampled"], out
    for o in got.values():
        assert o["kind"] == "t2t" and int(o["prompt"]) > 3 and o["n"] == "4" and o["reason"] == "length", out
        assert o["what"].startswith("'") or o["what"].startswith('"'), out      # text, not token ids


def test_declare_model_is_planned_and_served(tmp_path):
    """`graphc plan examples/declare_model.py --gpu cpu` exits 0 and writes the plan (one node, its KV pool,
    both walks, the t2t kind); python_api.py serves it on seeded weights (token ids in, token ids out)."""
    plan = tmp_path / "declared.plan"
    out = run(GRAPHC + ["plan", "examples/declare_model.py", "--gpu", "cpu", "-o", str(plan)])
    assert plan.is_file() and "FITS" in out and "requests: t2t = prefill -> decode" in out, out
    assert "kv_cache: 128 pages" in out, out
    out = run([sys.executable, "examples/python_api.py", str(plan), "--random-weights", "--max-tokens", "5"])
    got = outputs(out)
    assert sorted(got) == ["ids", "ids-sampled"], out
    for o in got.values():
        ids = [int(t) for t in re.findall(r"\d+", o["what"].removeprefix("token ids"))]
        assert o["kind"] == "t2t" and o["n"] == "5" and len(ids) == 5 and all(0 <= t < 256 for t in ids), out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, port: int, seconds: float = 90) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert proc.poll() is None, f"graphc run exited {proc.returncode}: {proc.stdout.read()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"graphc run did not answer /health on port {port} within {seconds} s")


def test_openai_client_against_graphc_run(tiny_omni_dir):
    """`graphc run PLAN --checkpoint DIR` on a free loopback port, then openai_client.py against it: the model
    listed, a chat completion, and the same chat streamed to the same greedy text and finish reason."""
    pytest.importorskip("openai")
    d, port = tiny_omni_dir, free_port()
    server = subprocess.Popen(GRAPHC + ["run", str(d / "p.plan"), "--checkpoint", str(d / "ckpt"),
                                        "--host", "127.0.0.1", "--port", str(port)],
                              cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(server, port)
        out = run([sys.executable, "examples/openai_client.py", "--base-url", f"http://127.0.0.1:{port}/v1",
                   "--max-tokens", "6"])
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    lines = out.splitlines()
    assert lines[0] == "models: qwen3_omni-tiny-checkpoint", out
    chat = re.match(r"^chat: (.*) \(finish_reason length, \d+ prompt \+ 6 completion tokens\)$", lines[1])
    stream = re.match(r"^stream: (.*) \(finish_reason length, 6 completion tokens\)$", lines[-1])
    assert chat and stream and chat[1] == stream[1] and len(chat[1]) > 2, out
