"""Soak graphc run's server: many concurrent streaming clients for minutes on a tiny CPU plan, on
loopback only. Passes when no request failed, no KV page leaked and the server's memory stayed flat.

    python examples/bench/soak.py                                   # 64 clients, 600 s
    python examples/bench/soak.py --seconds 60 --json soak.json     # the CI version (tests/unit/test_soak.py)
    python examples/bench/soak.py --plan P.plan --checkpoint DIR    # a plan of your own, still on 127.0.0.1

Without --plan it makes the tiny Qwen3-Omni checkpoint with a talker (examples/make_tiny_checkpoint.py
omni-speech, HF's seeded init) and its CPU plan in a temporary folder. It starts `graphc run PLAN
--checkpoint DIR` as a separate process on a free 127.0.0.1 port, so the RSS read from /proc/PID/status is
the server's alone, and runs --clients asyncio clients (the `openai` AsyncOpenAI client, raw server-sent
events read line by line). Each client loops until --seconds have passed: it draws a kind the plan serves,
sends it, reads the whole stream and checks how it ended:

    chat         /v1/chat/completions streamed, text: a role chunk, one finish_reason (stop or length), the
                 usage chunk (1 <= completion_tokens <= max_tokens), then [DONE], no error event
    completion   /v1/completions streamed, a text or token-id prompt: as chat
    audio_in     chat with an input_audio part (base64 WAV, 0.5-2 s tone): as chat            (kind a2t)
    image_in     chat with an image_url part (data URL PNG, 32x32 to 96x128): as chat         (kind i2t)
    speech       /v1/audio/speech, stream_format sse, pcm: audio deltas, then speech.audio.done with usage
                                                                                             (kind t2s)
    chat_audio   chat with modalities ["text", "audio"], pcm16, streamed: as chat; end of turn ignored (an
                 answer whose first token ends the turn never closes: docs/soak.md)
Both speaking kinds: audio bytes (an even count, 16-bit) when the usage counts codec frames, none when it
counts 0 (the tiny model's talker may draw its end code first: seeded, it does so alone as in a batch).

The server runs with --max-waiting 4 x --clients: its default bound (8 x the decode walk's sequences, 64
on the tiny plan) equals 64 clients, and a cancelled request counts as waiting until the engine thread
takes its abort, so a client that cancels and sends again at once could be refused with 429 (the bound
itself is tests/unit/test_saturation.py's). Here a 429 is a failure.

--cancel of the requests (5%) are asked for 200 tokens or frames (end of turn ignored) and closed by the
client after 1-5 events: counted as cancelled, not failed (one that ends before its cancel point counts as
completed). The server must count at least half of them as aborted (GET /metrics; the rest raced their
end). A failure is counted by its cause (HTTP status, missing [DONE], error event, no audio, timeout,
exception).

Reported: requests completed, cancelled and failed (by kind, by cause), what the server counted finished
by status (GET /metrics), text tokens a second (the usage's completion_tokens over the loaded time),
latency p50/p99 (send to the stream's end, completed requests) and to the first event (after chat's role
chunk), and the server's RSS, sampled every --sample seconds: at start, at warm-up's end (--warmup, default
10% of --seconds and at least 20 s: the median of the 3 samples around it), at the end of the load (the
median of the last 3), their difference, and the slope of a line fitted to the samples after warm-up.
After the load the script waits for the server to be idle and reads GET /health: running == waiting == 0
and free_pages == pages (the thinker's KV pool), speech_free_pages == speech_pages and nothing speaking
(the talker's), else the difference is leaked pages.

Exit code 1 when a request failed, a page leaked, the server did not get idle or exited by itself, it
counted fewer aborts than half the cancels, or its RSS grew by more than --rss-bound-mb after warm-up; 2 when
it could not start. The JSON keeps the first 50 failures, each with its request (media as their length) and
the first and last events that came back; --kinds sends only some kinds (to chase one).
The default bound, 20 MiB, is about 4% of the tiny server's ~480 MiB and 5x the swing of its samples under
load (+-2 MiB): it catches a leak of about 4 KB a request over 10 minutes (~5,000 requests after warm-up)
and of 50 KB a request over 60 s. The summary is printed and, with --json, written with every RSS sample;
progress goes to stderr every --every seconds. The server gets SIGINT at the end (SIGKILL 15 s later if
it is still alive), also on Ctrl-C or an error.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
KINDS = {"chat": ("t2t", 30), "completion": ("t2t", 20), "audio_in": ("a2t", 15), "image_in": ("i2t", 15),
         "speech": ("t2s", 10), "chat_audio": ("t2s", 10)}          # kind: (the plan's request kind, weight)
TEXTS = ["hello world, how are you today?", "the quick brown fox jumps over the lazy dog",
         "what is in the image", "transcribe this audio please", "graphc plans and serves multimodal models",
         "numbers 0123456789 and symbols !?.,;:", "describe the video"]
VOICE = "ethan"


# ---- the server process
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_plan(where: Path) -> tuple[Path, Path]:
    """The tiny Qwen3-Omni checkpoint with a talker and its CPU plan, made by subprocesses (this process stays
    light: no torch)."""
    ckpt, plan = where / "ckpt", where / "tiny.plan"
    subprocess.run([sys.executable, str(ROOT / "examples" / "make_tiny_checkpoint.py"), "omni-speech", str(ckpt)],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "graphc.cli", "plan", "models/qwen3_omni.py", "--preset", "tiny",
                    "--checkpoint", str(ckpt), "--gpu", "cpu", "-o", str(plan), "-q"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    return plan, ckpt


def start_server(plan: Path, ckpt: Path, port: int, log: Path, max_waiting: int) -> subprocess.Popen:
    """graphc run in a new session (a Ctrl-C in the terminal reaches this script, which stops it)."""
    cmd = [sys.executable, "-m", "graphc.cli", "run", str(plan), "--checkpoint", str(ckpt), "--host", "127.0.0.1",
           "--port", str(port), "--max-waiting", str(max_waiting)]
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop_server(proc: subprocess.Popen, grace: float = 15.0) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def served_kinds(log: Path) -> list[str]:
    """The kinds graphc run's first line names ('..., kinds t2t, a2t, i2t, t2s, booted in ...')."""
    for line in log.read_text(errors="replace").splitlines():
        if ", kinds " in line:
            return [k.strip() for k in line.split(", kinds ", 1)[1].split(", booted")[0].split(",")]
    return []


# ---- inputs
def wav_b64(seconds: float, hz: float) -> str:
    t = np.arange(int(16000 * seconds)) / 16000
    pcm = (0.3 * np.sin(2 * np.pi * hz * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    return base64.b64encode(buf.getvalue()).decode()


def png_url(h: int, w: int, seed: int) -> str:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((h, w, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


AUDIO = [wav_b64(s, hz) for s, hz in ((0.5, 220), (1.0, 440), (2.0, 330))]
IMAGES = [png_url(h, w, i) for i, (h, w) in enumerate(((32, 32), (64, 64), (96, 128)))]


def request(kind: str, rng: random.Random, cancel: bool) -> tuple[str, dict, int]:
    """(route, the openai client's arguments, max_tokens) of one request of `kind`; graphc's own fields go in
    extra_body."""
    n = 200 if cancel else rng.randint(4, 48)
    text = rng.choice(TEXTS)
    extra = {"ignore_eos": True} if cancel else {}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    if kind == "completion":
        prompt = text if rng.random() < 0.5 else [rng.randrange(5, 380) for _ in range(rng.randint(4, 64))]
        return "completions", {"prompt": prompt, "max_tokens": n, **usage, "extra_body": extra}, n
    if kind == "speech":
        return "speech", {"input": text, "voice": VOICE, "response_format": "pcm", "stream_format": "sse",
                          "extra_body": {"seed": rng.randrange(1 << 30),
                                         "max_frames": 200 if cancel else rng.randint(8, 40)}}, 0
    content: str | list = text
    if kind == "audio_in":
        content = [{"type": "input_audio", "input_audio": {"data": rng.choice(AUDIO), "format": "wav"}},
                   {"type": "text", "text": text}]
    elif kind == "image_in":
        content = [{"type": "image_url", "image_url": {"url": rng.choice(IMAGES)}}, {"type": "text", "text": text}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": n, **usage,
            "temperature": rng.choice([0, 0.7, 1.0]), "extra_body": extra}
    if kind == "chat_audio":
        body |= {"modalities": ["text", "audio"],
                 "audio": {"voice": VOICE, "format": "pcm16", "max_frames": 200 if cancel else rng.randint(8, 40)}}
    return "chat", body, n


# ---- one request, read and checked
class Outcome:
    def __init__(self, kind: str):
        self.kind, self.status, self.cause, self.detail = kind, "completed", None, None
        self.tokens, self.frames, self.audio_bytes, self.ttft, self.latency = 0, 0, 0, None, None


def check_text(events: list, n: int, chat: bool, out: Outcome) -> str | None:
    """None when a chat or completion stream ended properly, else the cause."""
    if not events or events[-1] != "[DONE]":
        return "no [DONE]"
    if "[DONE]" in events[:-1]:
        return "data after [DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    if any("error" in c for c in chunks):
        return "error event: " + next(c for c in chunks if "error" in c)["error"].get("message", "")[:80]
    first = (chunks[0].get("choices") or [{}])[0] if chunks else {}
    if chat and (first.get("delta") or {}).get("role") != "assistant":
        return "no role chunk"
    ends = [c["choices"][0]["finish_reason"] for c in chunks
            if c.get("choices") and c["choices"][0].get("finish_reason")]
    if len(ends) != 1:
        return f"{len(ends)} finish_reasons"
    if ends[0] not in ("stop", "length"):
        return f"finish_reason {ends[0]}"
    if not chunks[-1].get("usage") or chunks[-1].get("choices"):
        return "no usage chunk"
    out.tokens = chunks[-1]["usage"]["completion_tokens"]
    out.frames = (chunks[-1]["usage"].get("completion_tokens_details") or {}).get("audio_tokens", 0)
    if not 1 <= out.tokens <= n:
        return f"completion_tokens {out.tokens} of max_tokens {n}"
    if ends[0] == "length" and out.tokens != n:
        return f"finish_reason length at {out.tokens} of {n} tokens"
    return None


def check_speech(events: list, out: Outcome) -> str | None:
    if not events:
        return "no events"
    last = json.loads(events[-1])
    if "error" in last:
        return "error event: " + last["error"].get("message", "")[:80]
    if last.get("type") != "speech.audio.done":
        return "no speech.audio.done"
    if any(json.loads(e).get("type") != "speech.audio.delta" for e in events[:-1]):
        return "an event that is not speech.audio.delta before done"
    out.frames = last["usage"]["output_tokens"]
    return None


def audio_of(data: str, kind: str) -> int:
    """Audio bytes in one SSE data line (speech deltas, or a chat chunk's delta.audio.data)."""
    if data == "[DONE]":
        return 0
    obj = json.loads(data)
    if kind == "speech":
        b64 = obj.get("audio") or ""
    else:
        ch = obj.get("choices") or [{}]
        b64 = ((ch[0].get("delta") or {}).get("audio") or {}).get("data") or ""
    return len(base64.b64decode(b64))


async def one(client, model: str, kind: str, rng: random.Random, cancel_frac: float, timeout: float) -> Outcome:
    out = Outcome(kind)
    cancel = rng.random() < cancel_frac
    cancel_at = rng.randint(1, 5) if cancel else None
    route, body, n = request(kind, rng, cancel)
    create = {"chat": client.chat.completions, "completions": client.completions,
              "speech": client.audio.speech}[route].with_streaming_response.create
    t0 = time.perf_counter()
    events: list[str] = []
    ended = False
    try:
        async with asyncio.timeout(timeout):
            async with create(model=model, **body) as resp:
                if resp.status_code != 200:
                    out.status, out.cause = "failed", f"http {resp.status_code}: {(await resp.text())[:80]}"
                    return out
                async for line in resp.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    events.append(data)
                    if out.ttft is None and data != "[DONE]" and not (route == "chat" and len(events) == 1):
                        out.ttft = time.perf_counter() - t0          # the first event after chat's role chunk
                    out.audio_bytes += audio_of(data, kind) if kind in ("speech", "chat_audio") else 0
                    ended = ended or data == "[DONE]" or '"finish_reason": "' in data or "speech.audio.done" in data
                    if cancel_at is not None and len(events) >= cancel_at and not ended:
                        out.status = "cancelled"            # leaving the block closes the connection
                        return out
    except TimeoutError:
        out.status, out.cause = "failed", "timeout"
    except Exception as e:           # the openai client's APIStatusError, a connection reset, a bad line
        code = getattr(e, "status_code", None)
        out.status, out.cause = "failed", f"{f'http {code}' if code else type(e).__name__}: {str(e)[:80]}"
    finally:
        out.detail = {"kind": kind, "cause": out.cause, "request": redact(body),
                      "seconds": round(time.perf_counter() - t0, 2),
                      "events": len(events), "audio_bytes": out.audio_bytes,
                      "first_event": events[0][:300] if events else None,
                      "last_event": events[-1][:300] if events else None}
    if out.status == "failed":
        return out
    out.latency = time.perf_counter() - t0
    cause = check_speech(events, out) if kind == "speech" else check_text(events, n, route == "chat", out)
    if cause is None and kind in ("speech", "chat_audio") and ((out.audio_bytes == 0) != (out.frames == 0)
                                                              or out.audio_bytes % 2):
        cause = f"{out.audio_bytes} audio bytes for {out.frames} frames"
    if cause is not None:
        out.status, out.cause = "failed", cause
        out.detail["cause"] = cause
    return out


def redact(x):
    """A request body with its media (long strings) replaced by their length, for a failure's record."""
    if isinstance(x, dict):
        return {k: redact(v) for k, v in x.items()}
    if isinstance(x, list):
        return [redact(v) for v in x]
    return f"<{len(x)} chars>" if isinstance(x, str) and len(x) > 200 else x


# ---- the run
class Tally:
    def __init__(self):
        self.counts: dict[str, Counter] = defaultdict(Counter)       # kind -> completed / cancelled / failed
        self.causes: Counter = Counter()
        self.examples: dict[str, str] = {}
        self.failures: list[dict] = []        # the first 50, each with its request and what came back
        self.latency: dict[str, list] = defaultdict(list)
        self.ttft: list[float] = []
        self.tokens = self.frames = self.audio_bytes = 0
        self.in_flight = 0

    def add(self, o: Outcome) -> None:
        self.counts[o.kind][o.status] += 1
        if o.status == "failed":
            cause = o.cause.split(":")[0]
            self.causes[cause] += 1
            self.examples.setdefault(cause, f"{o.kind}: {o.cause}")
            if len(self.failures) < 50:
                self.failures.append(o.detail)
        elif o.status == "completed":
            self.latency[o.kind].append(o.latency)
            if o.ttft is not None:
                self.ttft.append(o.ttft)
            self.tokens += o.tokens
            self.frames += o.frames
            self.audio_bytes += o.audio_bytes

    def total(self, status: str) -> int:
        return sum(c[status] for c in self.counts.values())


def pct(xs, q) -> float | None:
    return round(float(np.percentile(xs, q)), 4) if xs else None


async def get(port: int, path: str) -> str:
    from urllib.request import urlopen

    def read():
        with urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.read().decode()
    return await asyncio.to_thread(read)


async def soak(args, port: int, pid: int, kinds: list[str]) -> dict:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                         timeout=args.request_timeout)
    model = json.loads(await get(port, "/v1/models"))["data"][0]["id"]
    mix = [k for k, (need, _) in KINDS.items() if need in kinds and (not args.kinds or k in args.kinds.split(","))]
    if not mix:
        raise SystemExit(f"no kind to send: the plan serves {', '.join(kinds)}; --kinds {args.kinds}")
    weights = [KINDS[k][1] for k in mix]
    tally, samples = Tally(), []
    t0 = time.monotonic()
    deadline = [t0 + args.seconds]           # brought forward when the server is gone
    samples.append((0.0, rss_mb(pid)))

    async def client_loop(i: int):
        rng = random.Random(args.seed * 1000 + i)
        while time.monotonic() < deadline[0]:
            tally.in_flight += 1
            try:
                tally.add(await one(client, model, rng.choices(mix, weights)[0], rng, args.cancel,
                                    args.request_timeout))
            finally:
                tally.in_flight -= 1

    async def sampler():
        last, done0, tok0 = t0, 0, 0
        while True:
            await asyncio.sleep(args.sample)
            now = time.monotonic()
            samples.append((round(now - t0, 1), rss_mb(pid)))
            if samples[-1][1] is None:
                print(f"[{now - t0:5.0f} s] graphc run is gone: the clients stop", file=sys.stderr, flush=True)
                deadline[0] = now
                return
            if now - last >= args.every - 1e-3:
                done = tally.total("completed")
                lat = [x for v in tally.latency.values() for x in v]
                print(f"[{now - t0:5.0f} s] completed {done} ({(done - done0) / (now - last):.1f}/s), cancelled "
                      f"{tally.total('cancelled')}, failed {tally.total('failed')} "
                      f"{dict(tally.causes) if tally.causes else ''}| {(tally.tokens - tok0) / (now - last):.0f} tok/s"
                      f" | p50 {pct(lat, 50)} s | in flight {tally.in_flight} | RSS {samples[-1][1]:.1f} MiB",
                      file=sys.stderr, flush=True)
                last, done0, tok0 = now, done, tally.tokens

    sampling = asyncio.create_task(sampler())
    await asyncio.gather(*(client_loop(i) for i in range(args.clients)))
    loaded_s = time.monotonic() - t0
    sampling.cancel()
    samples.append((round(loaded_s, 1), rss_mb(pid)))
    # idle: every stream closed by now; the server frees a dropped client's pages on its next step
    health, metrics, t1 = {}, {}, time.monotonic()
    try:
        while time.monotonic() - t1 < args.idle_timeout:
            health = json.loads(await get(port, "/health"))
            if health["running"] == 0 and health["waiting"] == 0 and health["free_pages"] == health["pages"] and \
                    health.get("speaking", 0) == 0 and health.get("speech_free_pages") == health.get("speech_pages"):
                break
            await asyncio.sleep(0.2)
        for line in (await get(port, "/metrics")).splitlines():
            if line.startswith("graphc_requests_total{"):
                labels, value = line[len("graphc_requests_total{"):].split("} ")
                status = dict(kv.split("=") for kv in labels.replace('"', "").split(","))["status"]
                metrics[status] = metrics.get(status, 0) + int(float(value))     # by status, summed over kinds
    except OSError as e:
        print(f"graphc run does not answer after the load: {e}", file=sys.stderr)
    idle_s = time.monotonic() - t1
    await client.close()
    return dict(tally=tally, samples=samples, loaded_s=loaded_s, health=health, idle_s=idle_s, metrics=metrics,
                rss_idle=rss_mb(pid), mix=mix)


def median_rss(samples, at: float, k: int = 3) -> float:
    """The median RSS of the k samples nearest `at` seconds (one sample alone is noisy: a step's buffers)."""
    near = sorted(samples, key=lambda s: abs(s[0] - at))[:k]
    return statistics.median(s[1] for s in near)


def report(args, r: dict, rss_start: float, plan: str, server_rc, exited) -> dict:
    t, samples = r["tally"], [s for s in r["samples"] if s[1] is not None]
    warm = args.warmup if args.warmup is not None else max(20.0, 0.1 * args.seconds)
    rss_warm = median_rss(samples, warm)
    rss_end = statistics.median(s[1] for s in samples[-3:])
    growth = rss_end - rss_warm
    after = np.array([s for s in samples if warm <= s[0] <= r["loaded_s"]])
    slope = float(np.polyfit(after[:, 0] / 60, after[:, 1], 1)[0]) if len(after) > 2 else None
    h = r["health"]
    leaked = h.get("pages", 0) - h.get("free_pages", 0) + h.get("speech_pages", 0) - h.get("speech_free_pages", 0)
    problems = []
    if t.total("failed"):
        problems.append(f"{t.total('failed')} requests failed: {dict(t.causes)}")
    if not h:
        problems.append("graphc run did not answer GET /health after the load")
    elif leaked or h.get("running") or h.get("waiting"):
        problems.append(f"not idle {args.idle_timeout:.0f} s after the load: {h}")
    if growth > args.rss_bound_mb:
        problems.append(f"RSS grew {growth:.1f} MiB after warm-up (bound {args.rss_bound_mb} MiB)")
    if t.total("completed") == 0:
        problems.append("no request completed")
    if exited is not None:
        problems.append(f"graphc run exited with code {exited} before the end")
    aborts = r["metrics"].get("abort", 0)
    if h and exited is None and aborts < t.total("cancelled") / 2:
        problems.append(f"the server counted {aborts} aborts for {t.total('cancelled')} streams cancelled mid-way: "
                        "it does not see clients go away")
    all_lat = [x for v in t.latency.values() for x in v]
    return {
        "date": time.strftime("%Y-%m-%d"), "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "plan": plan, "clients": args.clients, "seconds": args.seconds, "loaded_s": round(r["loaded_s"], 1),
        "cancel_fraction": args.cancel, "kinds": r["mix"],
        "requests": {"completed": t.total("completed"), "cancelled": t.total("cancelled"),
                     "failed": t.total("failed"), "failed_by_cause": dict(t.causes),
                     "failure_examples": t.examples, "by_kind": {k: dict(c) for k, c in sorted(t.counts.items())},
                     "server_finished": r["metrics"], "failures": t.failures},
        "throughput": {"requests_per_s": round(t.total("completed") / r["loaded_s"], 2),
                       "tokens": t.tokens, "tokens_per_s": round(t.tokens / r["loaded_s"], 1),
                       "speech_frames": t.frames, "audio_samples": t.audio_bytes // 2},
        "latency_s": {"p50": pct(all_lat, 50), "p99": pct(all_lat, 99), "ttft_p50": pct(t.ttft, 50),
                      "ttft_p99": pct(t.ttft, 99),
                      "by_kind": {k: {"p50": pct(v, 50), "p99": pct(v, 99)} for k, v in sorted(t.latency.items())}},
        "rss_mib": {"start": round(rss_start, 1), "warmup_s": warm, "warm": round(rss_warm, 1),
                    "end": round(rss_end, 1), "growth": round(growth, 1), "bound": args.rss_bound_mb,
                    "slope_mib_per_min": round(slope, 3) if slope is not None else None,
                    "peak": round(max(s[1] for s in samples), 1),
                    "idle_after": round(r["rss_idle"], 1) if r["rss_idle"] else None,
                    "samples": [[s[0], round(s[1], 1)] for s in samples]},
        "health_after": h, "idle_after_s": round(r["idle_s"], 2), "leaked_pages": leaked,
        "server_exit_code": server_rc, "problems": problems, "ok": not problems,
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def summary(s: dict) -> str:
    q, th, lat, rss = s["requests"], s["throughput"], s["latency_s"], s["rss_mib"]
    lines = [
        f"soak: {s['clients']} clients, {s['loaded_s']:.0f} s, kinds {', '.join(s['kinds'])} ({s['plan']})",
        f"  requests   completed {q['completed']} ({th['requests_per_s']}/s), cancelled {q['cancelled']}, "
        f"failed {q['failed']} {q['failed_by_cause'] or ''}",
        "  by kind    " + "; ".join(f"{k} {c.get('completed', 0)}/{c.get('cancelled', 0)}/{c.get('failed', 0)}"
                                    for k, c in q["by_kind"].items()) + "  (completed/cancelled/failed)",
        f"  tokens     {th['tokens']} ({th['tokens_per_s']} tok/s), speech {th['speech_frames']} frames, "
        f"{th['audio_samples']} audio samples",
        f"  latency    p50 {lat['p50']} s, p99 {lat['p99']} s; first event p50 {lat['ttft_p50']} s, "
        f"p99 {lat['ttft_p99']} s",
        f"  RSS MiB    start {rss['start']}, at warm-up end ({rss['warmup_s']:.0f} s) {rss['warm']}, end {rss['end']}: "
        f"{rss['growth']:+.1f} (bound {rss['bound']}); fit after warm-up {rss['slope_mib_per_min']} MiB/min; "
        f"peak {rss['peak']}, idle after {rss['idle_after']}",
        f"  server     finished by status {q['server_finished']}",
        f"  after      {s['health_after']} ({s['idle_after_s']} s to idle): {s['leaked_pages']} leaked pages; "
        f"server exit code {s['server_exit_code']}",
    ]
    for p in s["problems"]:
        lines.append(f"  FAILED     {p}")
    for cause, ex in q["failure_examples"].items():
        lines.append(f"  e.g.       {ex}")
    lines.append("  OK" if s["ok"] else "  NOT OK")
    return "\n".join(lines)


def wait_up(proc: subprocess.Popen, port: int, log: Path, timeout: float) -> None:
    from urllib.request import urlopen

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"graphc run exited with code {proc.returncode}:\n{tail(log)}")
        try:
            with urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if json.load(r)["status"] == "ok":
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"graphc run did not answer /health in {timeout:.0f} s:\n{tail(log)}")


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", default=None, help="a plan to serve (default: the tiny Qwen3-Omni, made here)")
    ap.add_argument("--checkpoint", default=None, metavar="DIR", help="its checkpoint (with --plan)")
    ap.add_argument("--seconds", type=float, default=600, help="how long the clients send (default 600)")
    ap.add_argument("--clients", type=int, default=64, help="concurrent streaming clients (default 64)")
    ap.add_argument("--kinds", default=None, help=f"a comma-separated subset of {', '.join(KINDS)} (default: all "
                                                  "the plan serves)")
    ap.add_argument("--cancel", type=float, default=0.05, help="fraction of requests cancelled mid-stream")
    ap.add_argument("--warmup", type=float, default=None, help="seconds (default 10%% of --seconds, at least 20)")
    ap.add_argument("--rss-bound-mb", type=float, default=20.0, help="most RSS growth after warm-up, MiB")
    ap.add_argument("--sample", type=float, default=5.0, help="seconds between RSS samples")
    ap.add_argument("--every", type=float, default=15.0, help="seconds between progress lines")
    ap.add_argument("--request-timeout", type=float, default=120.0, help="a request longer than this failed")
    ap.add_argument("--idle-timeout", type=float, default=30.0, help="how long the server may take to get idle")
    ap.add_argument("--seed", type=int, default=0, help="the clients' draws")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the summary and RSS samples here")
    args = ap.parse_args(argv)
    if (args.plan is None) != (args.checkpoint is None):
        ap.error("--plan and --checkpoint go together")
    with tempfile.TemporaryDirectory(prefix="graphc-soak-") as tmp:
        tmp = Path(tmp)
        if args.plan:
            plan, ckpt = Path(args.plan).resolve(), Path(args.checkpoint).resolve()
        else:
            print("making the tiny checkpoint and its CPU plan ...", file=sys.stderr, flush=True)
            plan, ckpt = make_plan(tmp)
        port, log = free_port(), tmp / "server.log"
        t_boot = time.monotonic()
        proc = start_server(plan, ckpt, port, log, 4 * args.clients)
        server_rc = None
        try:
            try:
                wait_up(proc, port, log, timeout=180)
            except RuntimeError as e:
                print(e, file=sys.stderr)
                return 2
            kinds = served_kinds(log)
            rss_start = rss_mb(proc.pid)
            print(f"graphc run (pid {proc.pid}) up in {time.monotonic() - t_boot:.1f} s on 127.0.0.1:{port}, kinds "
                  f"{', '.join(kinds)}, RSS {rss_start:.1f} MiB; {args.clients} clients for {args.seconds:.0f} s",
                  file=sys.stderr, flush=True)
            r = asyncio.run(soak(args, port, proc.pid, kinds))
        except KeyboardInterrupt:
            print("interrupted: no summary", file=sys.stderr)
            return 130
        finally:
            exited = proc.poll()                 # before it was asked to stop: it died
            t_stop = time.monotonic()
            server_rc = stop_server(proc)
            print(f"graphc run stopped in {time.monotonic() - t_stop:.1f} s (exit code {server_rc})", file=sys.stderr)
        s = report(args, r, rss_start, plan.name if args.plan else "tiny Qwen3-Omni with talker, CPU", server_rc,
                   exited)
        if not s["ok"]:
            print(f"graphc run's log ends:\n{tail(log)}", file=sys.stderr)
    print(summary(s))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(s, indent=1) + "\n")
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
