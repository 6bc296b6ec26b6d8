"""WS /v1/realtime latency against a running `graphc run`: N sessions at once each stream a spoken question in
real time (20 ms appends, paced by the wall clock) and wait for the answer; then each speaks again while its
answer plays (barge-in). Measured per session:

  first_audio_ms   from the server's speech_stopped event to the answer's first output audio delta
  barge_in_ms      from sending the append that holds the new speech's onset to the cancelled response.done
                   (after which no audio of that answer comes): VAD's 32 ms window included, in two parts:
  vad_ms           from that append to the server's speech_started event
  cancel_ms        from speech_started to the cancelled response.done
  later_turn_ms    the interrupting speech's turn: from its speech_stopped to its answer's first audio delta
                   (a later turn of the conversation: its prompt holds the first turn's audio and answer)

and per N, from the server's /metrics before and after (graphc_realtime_first_audio_phase_seconds), the mean ms
from speech_stopped to each step toward the first audio: prepared (the request rendered, its audio
preprocessed, admitted), first_token, follow_prompt (the talker's prompt), first_frame, first_audio (the
engine's first chunk) and sent (the delta sent), over every first audio of the round.

The speech is a synthetic voiced signal (harmonics of a moving pitch through vowel formants) that Silero's VAD
takes for speech; with seeded weights the model's own speech is noise to a VAD. The server needs a tokenizer and
chat template (realtime sessions render their conversation): seeded weights with a synthetic tokenizer at the
plan's ids serve it (or --checkpoint DIR holding the real files).

    python examples/tools/synthetic_tokenizer.py plans/qwen3_omni_h200.plan /tmp/tok
    graphc run plans/qwen3_omni_h200.plan --random-weights --tokenizer /tmp/tok --port 8000 &
    python examples/bench/realtime_latency.py --port 8000 --sessions 1 8 32 --json OUT/realtime.json
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import statistics
import time

import numpy as np

RATE, CHUNK_MS = 24_000, 20
VOWELS = [(700, 1220, 2600), (300, 2300, 3000), (500, 900, 2400), (400, 1900, 2550), (600, 1000, 2500)]


def voiced(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    f0 = 130 + 25 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    formants = np.array(VOWELS, float)[(t // 0.22).astype(int) % len(VOWELS)]
    y = np.zeros(len(t))
    for k in range(1, 30):
        y += sum(1 / (1 + ((k * f0 - formants[:, j]) / (80 + 40 * j)) ** 2) for j in range(3)) / k ** 0.5 * np.sin(k * phase)
    y *= np.sin(np.pi * (t % 0.22) / 0.22) ** 0.6
    return (0.3 * y / np.abs(y).max()).astype(np.float32)


def appends(samples: np.ndarray) -> list[str]:
    n = RATE * CHUNK_MS // 1000
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    return [json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i:i + n].tobytes()).decode()})
            for i in range(0, len(pcm), n)]


async def stream(ws, frames: list[str], onset_index: int | None = None) -> float | None:
    """Send the appends in real time; the wall time the onset's append went, when asked."""
    t0, onset = time.perf_counter(), None
    for i, frame in enumerate(frames):
        await asyncio.sleep(max(0.0, t0 + i * CHUNK_MS / 1000 - time.perf_counter()))
        await ws.send(frame)
        if i == onset_index:
            onset = time.perf_counter()
    return onset


async def first_audio(ws, old: str | None = None, stopped: float | None = None) -> tuple[float, float | None, str]:
    """Events up to the first output audio delta, after a speech_stopped, of a response other than `old`:
    (when speech_stopped came, when that delta came, its response id); None for the delta's time when that
    response ended with no audio."""
    while True:
        ev = json.loads(await ws.recv())
        if ev["type"] == "input_audio_buffer.speech_stopped":
            stopped = time.perf_counter()
        elif ev["type"] == "response.output_audio.delta" and stopped is not None and ev["response_id"] != old:
            return stopped, time.perf_counter(), ev["response_id"]
        elif ev["type"] == "response.done" and stopped is not None and ev["response"]["id"] != old:
            return stopped, None, ev["response"]["id"]


async def one_session(url: str, question: list[str], barge: list[str], onset_index: int, max_tokens: int) -> dict:
    import websockets

    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"max_output_tokens": max_tokens}}))
        sender = asyncio.create_task(stream(ws, question))
        stopped, first, answering = await first_audio(ws)
        await sender
        onset = asyncio.create_task(stream(ws, barge, onset_index))
        started = stopped2 = None
        while True:
            ev = json.loads(await ws.recv())
            if ev["type"] == "input_audio_buffer.speech_started":
                started = time.perf_counter()
            elif ev["type"] == "input_audio_buffer.speech_stopped":
                stopped2 = time.perf_counter()
            if ev["type"] == "response.done" and ev["response"]["id"] == answering:
                ended, status = time.perf_counter(), ev["response"]["status"]
                break
        stopped2, first2, _ = await first_audio(ws, answering, stopped2)     # the new speech's answer, read as
        sent = await onset                                                    # the appends still go out
        cut = status == "cancelled" and sent and started
        return {"first_audio_ms": (first - stopped) * 1e3, "barge_in_ms": (ended - sent) * 1e3 if cut else None,
                "vad_ms": (started - sent) * 1e3 if cut else None,
                "cancel_ms": (ended - started) * 1e3 if cut else None, "status": status,
                "later_turn_ms": (first2 - stopped2) * 1e3 if first2 is not None else None}


def phase_sums(host: str, port: int) -> dict[str, tuple[float, float]]:
    """phase -> (sum of seconds, count) of the server's first-audio phases so far."""
    import urllib.request

    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        for part, i in (("_sum{", 0), ("_count{", 1)):
            if line.startswith("graphc_realtime_first_audio_phase_seconds" + part):
                name = line.split('phase="', 1)[1].split('"', 1)[0]
                out.setdefault(name, [0.0, 0.0])[i] = float(line.rsplit(" ", 1)[1])
    return {k: (v[0], v[1]) for k, v in out.items()}


def phase_means(before: dict, after: dict) -> dict[str, float]:
    """Mean ms of each phase over the observations between two phase_sums()."""
    out = {}
    for k, (s, n) in after.items():
        s0, n0 = before.get(k, (0.0, 0.0))
        if n > n0:
            out[k] = round((s - s0) / (n - n0) * 1e3, 1)
    return out


def summary(values: list[float]) -> dict:
    values = sorted(v for v in values if v is not None)
    if not values:
        return {}
    return {"n": len(values), "p50": round(statistics.median(values), 1),
            "p90": round(values[max(0, math.ceil(0.9 * len(values)) - 1)], 1), "max": round(values[-1], 1)}


async def main(args) -> dict:
    url = f"ws://{args.host}:{args.port}/v1/realtime"
    question = appends(np.concatenate([np.zeros(RATE // 2, np.float32), voiced(args.speech_s),
                                       np.zeros(RATE, np.float32)]))
    lead = RATE // 5                                        # 200 ms of silence before the barge-in speech
    barge = appends(np.concatenate([np.zeros(lead, np.float32), voiced(1.0), np.zeros(RATE, np.float32)]))
    onset_index = lead // (RATE * CHUNK_MS // 1000)
    out = {}
    for _ in range(args.warmup):        # the server's first turn pays one-time costs (VAD, resampler, first steps)
        await one_session(url, question, barge, onset_index, args.max_tokens)
    for n in args.sessions:
        before = phase_sums(args.host, args.port)
        runs = await asyncio.gather(*(one_session(url, question, barge, onset_index, args.max_tokens)
                                      for _ in range(n)))
        out[n] = {k: summary([r[k] for r in runs])
                  for k in ("first_audio_ms", "barge_in_ms", "vad_ms", "cancel_ms", "later_turn_ms")}
        out[n]["not_cancelled"] = sum(r["status"] != "cancelled" for r in runs)
        out[n]["phases_mean_ms"] = phase_means(before, phase_sums(args.host, args.port))
        print(f"{n:3d} sessions: first audio {out[n]['first_audio_ms']}, barge-in {out[n]['barge_in_ms']} "
              f"(VAD {out[n]['vad_ms']}, then cancel {out[n]['cancel_ms']}); the interrupting speech's answer: "
              f"first audio {out[n]['later_turn_ms']}; server phases, mean ms from speech_stopped: "
              f"{out[n]['phases_mean_ms']}", flush=True)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--speech-s", type=float, default=2.0, help="seconds of the spoken question")
    ap.add_argument("--max-tokens", type=int, default=256, help="max_output_tokens of the answers (long enough to "
                    "still be playing at the barge-in)")
    ap.add_argument("--warmup", type=int, default=1, help="sessions run one at a time first and not counted")
    ap.add_argument("--json", default=None, help="where the results go")
    args = ap.parse_args()
    results = asyncio.run(main(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
