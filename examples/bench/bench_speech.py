"""Speech-out serving on a plan: first-audio latency and audio seconds a wall second at several concurrencies.

    python examples/bench/bench_speech.py plans/qwen3_omni_h200.plan --random-weights --concurrency 1 4 16 \\
        --out docs/data/speech_h200.json

Closed loop per concurrency c: c requests in flight, a new one added as one closes, until --requests have
closed (after one warm-up request). T2S prompts are a chat turn of random text ids; A2S prompts hold a
synthetic clip (--seconds) in the user turn. Seeded weights speak noise, so the thinker's text is capped
(--text-tokens, end of turn ignored) and the talker runs --frames frames (12.5 a second of audio) unless its
end code comes first. Reported per kind and c: audio-s/s (audio seconds made / wall seconds), TTFA
(arrival to the first audio chunk) p50/p95, RTF p50 (a request's time / its audio seconds), the stall a listener
playing from the first chunk hears (Output.times audio_stall_s) p50 and max, and the engine's steps per walk.
The chat ids are the host's (the real model's for seeded weights of the real preset).

--profile FILE: last, one more round of the last kind at the last concurrency (c requests at once) under
torch.profiler: the GPU's busy time on each CUDA stream and on all together, its time by the step that launched
it, its idle time by what the engine's thread was doing (examples/bench/gpu_idle.py), the host's time in each
of the engine's phases, and the profiler's tables, to FILE (the head printed too).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

from bench_steps import drop_kernels, knob_setting, set_knobs  # noqa: E402
from graphc.modules import KERNEL_KNOBS  # noqa: E402
from graphc.plan import load_plan  # noqa: E402


def prompt(engine, rng, kind: str, n: int) -> list[int]:
    """<|im_start|>user\n [audio] text <|im_end|>\n<|im_start|>assistant\n in the host's ids."""
    ids, media = engine.host.speech.ids, engine.host.media
    vocab = engine.model.node(engine.llm).config.vocab_size
    special = {ids["im_start_token_id"], ids["user_token_id"], ids["assistant_token_id"], media.audio_token_id,
               media.audio_start_token_id, media.image_token_id, media.video_token_id, media.vision_start_token_id}
    text = [t for t in rng.integers(0, min(vocab, 150_000), n + 16).tolist() if t not in special][:n]
    nl = text[0]
    audio = [media.audio_start_token_id, media.audio_token_id, engine.host.audio_end] if kind == "a2s" else []
    return [ids["im_start_token_id"], ids["user_token_id"], nl, *audio, *text, nl, ids["im_start_token_id"],
            ids["assistant_token_id"], nl]


def pct(xs, q):
    return float(np.percentile(xs, q)) if xs else float("nan")


def run(engine, kind: str, c: int, total: int, args, rng) -> dict:
    from graphc import Media
    from graphc.runtime.sampler import SamplingParams
    from graphc.runtime.speech import SpeechParams

    def add():
        media = []
        if kind == "a2s":
            n = int(args.seconds * 16000)
            t = np.arange(n) / 16000
            media = [Media("audio", (0.2 * np.sin(2 * np.pi * rng.uniform(100, 800) * t)
                                     + 0.02 * rng.standard_normal(n)).astype(np.float32))]
        return engine.add(prompt_token_ids=prompt(engine, rng, kind, args.prompt), media=media,
                          params=SamplingParams(temperature=0, max_tokens=args.text_tokens, ignore_eos=True),
                          speech=SpeechParams(max_frames=args.frames))

    before = dict(engine.scheduler.stats.steps)
    live, done, started, reqs = [], [], 0, []
    t0 = time.perf_counter()
    while len(done) < total:
        while len(live) < c and started < total:
            live.append(add())
            reqs.append(live[-1])
            started += 1
        engine.step()
        for r in [r for r in live if r.closed]:
            live.remove(r)
            done.append(engine.output(r))
    wall = time.perf_counter() - t0
    audio_s = [len(o.audio) / o.sample_rate for o in done]
    ttfa = [o.times["first_audio_s"] * 1e3 for o in done if "first_audio_s" in o.times]
    rtf = [o.times["total_s"] / a for o, a in zip(done, audio_s) if a > 0]
    stall = [o.times["audio_stall_s"] * 1e3 for o in done if "audio_stall_s" in o.times]
    steps = {w: n - before.get(w, 0) for w, n in engine.scheduler.stats.steps.items() if n - before.get(w, 0)}
    errors = [o.error for o in done if o.error]
    phases = {}                       # where first audio goes: median ms from arrival to each mark
    for mark in ("first_token", "follow_prompt", "first_frame", "first_audio"):
        got = [(r.times[mark] - r.times["arrived"]) * 1e3 for r in reqs if mark in r.times]
        phases[mark] = pct(got, 50)
    return {"kind": kind, "c": c, "requests": total, "wall_s": wall, "audio_s": sum(audio_s),
            "audio_s_per_s": sum(audio_s) / wall, "ttfa_ms": {"p50": pct(ttfa, 50), "p95": pct(ttfa, 95)},
            "rtf_p50": pct(rtf, 50), "stall_ms": {"p50": pct(stall, 50), "max": max(stall, default=0.0)},
            "frames": [len(o.audio_codes) for o in done], "steps": steps,
            "errors": errors[:3], "text_tokens": [len(o.token_ids) for o in done], "phases_ms_p50": phases}


def profile_round(engine, kind: str, c: int, args, rng, path: str) -> None:
    """One closed-loop round of c requests under torch.profiler (host and GPU); its lines and tables to `path`."""
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile

    from gpu_idle import aligned, annotated, busy_lines, idle_lines, launched_lines, trace_events

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, annotated(engine) as spans:
        row = run(engine, kind, c, c, args, rng)
    events = trace_events(prof)
    events += aligned(spans, events)
    host = Counter()
    for t0, t1, name in spans:
        host[name] += (t1 - t0) if t1 is not None else 0.0
    lines = [f"{kind} at c = {c}, {c} requests: round {row['wall_s'] * 1e3:.1f} ms, {row['audio_s']:.1f} s of audio, "
             f"RTF p50 {row['rtf_p50']:.3f}; steps {row['steps']}",
             *busy_lines(events), *launched_lines(events), *idle_lines(events),
             "host time in each of the engine's phases (labels nest: engine.step holds the rest):",
             *[f"  {s * 1e3:9.1f} ms  {name}" for name, s in host.most_common() if s >= 1e-4],
             "(the profiler's own overhead is in these times)"]
    ka = prof.key_averages()
    tables = [ka.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=70),
              ka.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70)]
    Path(path).write_text("\n".join(lines + tables) + "\n")
    print("\n".join(lines), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--kinds", nargs="+", default=["a2s", "t2s"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=0, help="closed per run (default: 2 x c, at least 4)")
    ap.add_argument("--text-tokens", type=int, default=32)
    ap.add_argument("--frames", type=int, default=100, help="codec frames a request speaks at most (12.5 a second)")
    ap.add_argument("--prompt", type=int, default=32, help="text tokens in the user turn")
    ap.add_argument("--seconds", type=float, default=4.0, help="A2S clip length")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--audio-lead-ms", type=float, default=None, help="graphc run --audio-lead-ms (default: none)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", default=None, metavar="FILE", help="last, one more round of the last kind at the "
                    "last concurrency under torch.profiler: where its GPU and host time go, to FILE")
    ap.add_argument("--drop", nargs="*", default=[], choices=KERNEL_KNOBS,
                    help="kernel knobs taken away on every node (e.g. moe_sm90_from, whose package, "
                         "nvidia-cutlass-dsl, the GPU image lacks; no speech step reaches its 2,048 rows)")
    ap.add_argument("--with", dest="adds", nargs="*", default=[], type=knob_setting, metavar="KNOB[=N]",
                    help="kernel knobs set on every node, N (1 unless given) each (e.g. gemm_rows=16)")
    a = ap.parse_args()
    from graphc.runtime.engine import Engine

    plan = load_plan(a.plan)
    drop_kernels(plan, a.drop)
    set_knobs(plan, dict(a.adds))
    engine = Engine(plan, checkpoint=a.checkpoint, random_weights=a.random_weights, audio_lead_ms=a.audio_lead_ms)
    print(engine.summary(), file=sys.stderr)
    rng = np.random.default_rng(a.seed)
    for kind in a.kinds:                                   # warm-up: one request of each kind
        run(engine, kind, 1, 1, a, rng)
    rows = []
    for kind in a.kinds:
        for c in a.concurrency:
            row = run(engine, kind, c, a.requests or max(2 * c, 4), a, rng)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("frames", "text_tokens")}), file=sys.stderr)
    result = {"plan": a.plan, "summary": engine.summary(), "args": vars(a), "rows": rows, "stats": engine.stats()}
    if a.profile:
        profile_round(engine, a.kinds[-1], a.concurrency[-1], a, rng, a.profile)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    for kind in a.kinds:
        print(f"\n{kind.upper()}\nc\taudio-s/s\tTTFA p50/p95 ms\tRTF p50\tstall p50/max ms")
        for r in rows:
            if r["kind"] == kind:
                print(f"{r['c']}\t{r['audio_s_per_s']:.1f}\t{r['ttfa_ms']['p50']:.0f}/{r['ttfa_ms']['p95']:.0f}"
                      f"\t{r['rtf_p50']:.3f}\t{r['stall_ms']['p50']:.0f}/{r['stall_ms']['max']:.0f}")


if __name__ == "__main__":
    main()
