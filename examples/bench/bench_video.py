"""Video to text (v2t) time to first token (TTFT) under concurrency, through `graphc run`'s serving path: c
requests of a synthetic clip each arrive at once. Target (issue 37): TTFT p50 at 4 streams <= 1.3 x that at 1.

    python examples/bench/bench_video.py plans/qwen3_omni_h200.plan $OUT/video.json --random-weights \\
        --streams 1 4 8 --seconds 30 --fps 2 --size 360 640 --tokens 16 --repeats 2

The defaults are that run: 60 frames of 360 x 640 and 20 text ids make 6,620 prompt rows at seeded weights'
default pixel bounds (no checkpoint), the clip of issue 37's reference. CPU smoke check of the script only
(plans/qwen3_omni_tiny_cpu.plan's video walk takes no clip at those bounds, so a tiny plan with a larger one):

    python -m graphc.cli plan models/qwen3_omni.py --preset tiny --gpu cpu -o /tmp/tiny_video.plan -q \\
        --set walks.video_prefill.budget.patches=2304 --set walks.video_prefill.budget.tokens=640
    python examples/bench/bench_video.py /tmp/tiny_video.plan /tmp/v.json --random-weights \\
        --streams 1 2 --seconds 2 --fps 2 --size 64 --tokens 2 --repeats 1

Qwen3.5's clips carry their frames' times as text, so its plans need a tokenizer: with seeded weights, one at
the plan's ids (`python examples/tools/synthetic_tokenizer.py plans/qwen3_5_9b_h200.plan /tmp/tok`, then
`--tokenizer /tmp/tok`). --gather-ms: the Driver's window for requests still preparing (`graphc run
--gather-ms`; 0 measures each request stepped as soon as it is ready).

The path measured is the server's without its HTTP layer: one graphc.Engine (seeded weights with
--random-weights) and the graphc.serve Driver that `graphc run` builds over it (graphc/serve/app.py). Each
request goes through Driver.submit(), which prepares it in a worker thread (Engine.prepare: the host
resizes and patchifies the frames, requests in parallel) and admits it on the engine thread, as a
/v1/completions handler does once it has decoded its media; the frames are made in memory
(graphc.serving.Media("video", frames, fps)), so no video file is decoded.

A request: --prompt random token ids (bench_prefix.id_source: never an end of turn or a media placeholder)
then the host's video placeholder id with a clip of --seconds x --fps frames of --size pixels (H W, or a side),
--tokens tokens greedily with the end of turn ignored. Every clip's frames are random pixels drawn afresh
(the warm-up's and every repeat's too), so the media cache, which keys encoder input by content
(graphc/runtime/media_cache.py), never serves one. One warm-up request of each clip length first, not
counted; then, per length and per --streams c, --repeats rounds of c requests submitted at once, each round
after the last has finished. Several --seconds run on one boot (seed 001's video cells: --seconds 60 30 8
--streams 16 32).

Per request (ms): ttft, first token as the client sees it (its first event, perf_counter) less its submit
time; engine_ttft, the engine's own (request.times first_token - arrived; the Request is made once its media
are preprocessed); prepared, submit to that Request (preprocessing and the wait for a thread). Per c: TTFT
p50/p95/max, p50(c) / p50(1) for the client's and the engine's TTFT, output tokens a second (c x --tokens
over a round's wall time, the median round: seed 001's video cells at --streams 16 32), prompt rows, the
engine's counters over
the rounds (stats(), after less before: steps per walk, rungs per walk/node/rung, the units each walk/node
carried: rows or patches) and the media cache's hits (0 unless a clip repeated, which would falsify the
measure). OUT.json holds the plan, the environment, the date and every sample; a table last. --profile FILE:
then one more request alone (--profile-streams N: N at once) under torch.profiler, with the round's wall time,
the GPU's busy time in it, the copies of its patches, how long after submission the GPU's first work came and
its idle time split by what the engine's thread was doing (examples/bench/gpu_idle.py); then such a round again,
unprofiled, counting the host calls that synchronised with the GPU. --switch-interval MS: Python's GIL hand-over
interval for the whole run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.bench.bench_prefix import environment, id_source  # noqa: E402

TARGET = 1.3          # the bound on TTFT p50 at 4 streams / at 1 stream


def clip_source(a, seed: int):
    """clip(seconds): a fresh uint8 clip [seconds x --fps, 3, H, W] of random pixels, never the same twice."""
    import torch

    h, w = a.size if len(a.size) == 2 else a.size * 2
    rng = np.random.default_rng(seed + 1)
    return lambda seconds: torch.from_numpy(rng.integers(0, 256, (max(1, round(seconds * a.fps)), 3, h, w),
                                                         dtype=np.uint8))


def requests(engine, draw, clip, a, n: int, seconds: float) -> list[dict]:
    """n Engine.prepare keyword sets: random ids, the video placeholder, a fresh clip of `seconds` each."""
    from graphc.runtime.sampler import SamplingParams
    from graphc.serving import Media

    params = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    token = engine.host.media.video_token_id
    return [{"prompt_token_ids": draw(a.prompt) + [token], "media": [Media("video", clip(seconds), float(a.fps))],
             "params": params} for _ in range(n)]


async def follow(t0: float, fut, events) -> dict:
    """One submitted request to its end: its client-side first token, and the engine's own times."""
    req = await fut
    first = None
    while True:
        ev = await events.get()
        if first is None and ev.token_ids:
            first = time.perf_counter()
        if ev.finished:
            break
    if req.error is not None or first is None:
        raise RuntimeError(f"request {req.id} failed: {req.error or req.finish_reason}")
    t = req.times
    return {"ttft_ms": (first - t0) * 1e3, "engine_ttft_ms": (t["first_token"] - t["arrived"]) * 1e3,
            "prepared_ms": (t["arrived"] - t0) * 1e3, "total_ms": (t["finished"] - t0) * 1e3,
            "prompt_rows": len(req.prompt.ids), "tokens": len(req.output)}


async def submit_all(driver, items: list[dict]) -> list[dict]:
    """Submit every request at once (as c clients would), then wait for all of them."""
    loop = asyncio.get_running_loop()
    waits = []
    for kw in items:
        t0 = time.perf_counter()
        fut, events = driver.submit(loop, kw)
        waits.append(follow(t0, fut, events))
    return list(await asyncio.gather(*waits))


def counted(engine) -> dict:
    """The engine's counters so far: steps per walk, per walk/node/rung, units a walk/node carried (rows,
    patches), and media cache hits per encoder."""
    s = engine.stats()
    return {"steps": s["steps"], "rungs": s["rungs"], "units": {k: v["used"] for k, v in s["padding"].items()},
            "cache_hits": {node: c["hits"] for node, c in s.get("media_cache", {}).items()}}


def one_round(engine, driver, loop, items: list[dict]) -> dict:
    """c requests at once: their samples and the engine's counters for them (after less before)."""
    before = counted(engine)
    t0 = time.perf_counter()
    samples = loop.run_until_complete(submit_all(driver, items))
    wall = time.perf_counter() - t0
    after = counted(engine)
    return {"wall_s": wall, "samples": samples} | {k: diff(before[k], after[k]) for k in after}


def diff(before: dict, after: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def summarize(c: int, rounds: list[dict], base: dict | None, tokens: int, seconds: float) -> dict:
    """TTFT percentiles over every request of c's rounds, the ratios to c = 1, steps summed over rounds, output
    tokens a second (c x tokens over a round's wall time, the rounds' median)."""
    samples = [s for r in rounds for s in r["samples"]]
    ttft, eng = [s["ttft_ms"] for s in samples], [s["engine_ttft_ms"] for s in samples]
    total = {k: dict(sum((Counter(r[k]) for r in rounds), Counter()))
             for k in ("steps", "rungs", "units", "cache_hits")}
    out = {"seconds": seconds, "c": c, "requests": len(samples), "ttft_ms_p50": float(np.median(ttft)),
           "ttft_ms_p95": float(np.percentile(ttft, 95)), "ttft_ms_max": max(ttft),
           "engine_ttft_ms_p50": float(np.median(eng)), "prepared_ms_p50": float(np.median(
               [s["prepared_ms"] for s in samples])), "prompt_rows": sorted({s["prompt_rows"] for s in samples}),
           "tok_s": c * tokens / float(np.median([r["wall_s"] for r in rounds])), **total, "rounds": rounds}
    base = base or (out if c == 1 else None)
    out["ratio"] = out["ttft_ms_p50"] / base["ttft_ms_p50"] if base else None
    out["engine_ratio"] = out["engine_ttft_ms_p50"] / base["engine_ttft_ms_p50"] if base else None
    return out


def check(engine, a) -> str | None:
    """Why this plan or these options cannot run the bench, else None."""
    if "v2t" not in engine.kinds():
        return (f"this plan serves no video to text (its request kinds: {', '.join(engine.kinds())}); "
                "use a plan with a video walk (plans/qwen3_omni_h200.plan, plans/qwen3_omni_tiny_cpu.plan)")
    if len(a.size) > 2 or min(a.size) < 1:
        return f"--size is {a.size}: give the frames' side (H) or their height and width (H W), each >= 1"
    if min(a.streams) < 1 or min(a.repeats, a.tokens, a.prompt) < 1 or min(a.seconds) <= 0 or a.fps <= 0:
        return "--streams, --repeats, --tokens and --prompt must be at least 1, --seconds and --fps above 0"
    if a.video_pixels is not None and not 1 <= a.video_pixels[0] <= a.video_pixels[1]:
        return f"--video-pixels is {a.video_pixels}: give MIN and MAX with 1 <= MIN <= MAX"
    return None


def set_video_pixels(engine, bounds: list[int] | None) -> None:
    """The host's video pixel bounds, as a checkpoint's video_preprocessor_config would set them (the bench's
    seeded weights have no checkpoint to read them from)."""
    if bounds is not None:
        vision = engine.host.vision
        engine.host.vision = type(vision).model_validate(
            {**vision.model_dump(), "video_min_pixels": bounds[0], "video_max_pixels": bounds[1]})


def table(rows: list[dict]) -> None:
    print(f"\n| clip | streams | prompt rows | TTFT p50 | p95 | max | p50 / p50(1) (<= {TARGET} at 4) | engine TTFT p50 | "
          "ratio | prepared p50 | tok/s | steps (walk: count) | cache hits |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        eng = "" if r["engine_ratio"] is None else f"{r['engine_ratio']:.2f}"
        steps = ", ".join(f"{w} {n}" for w, n in r["steps"].items())
        prompt = "/".join(map(str, r["prompt_rows"]))
        print(f"| {r['seconds']:g} s | {r['c']} | {prompt} | {r['ttft_ms_p50']:.1f} | {r['ttft_ms_p95']:.1f} | {r['ttft_ms_max']:.1f} | "
              f"{ratio} | {r['engine_ttft_ms_p50']:.1f} | {eng} | {r['prepared_ms_p50']:.1f} | {r['tok_s']:.0f} | "
              f"{steps} | {sum(r['cache_hits'].values())} |", flush=True)


def save(a, engine, warm: dict, rows: list[dict]) -> None:
    """OUT.json: the plan, the environment, the date, the stream counts measured so far with every sample."""
    stats = engine.stats()
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
              "plan": a.plan, "summary": engine.summary(), "args": vars(a), "environment": environment(),
              "path": "graphc.serve Driver.submit (Engine.prepare in worker threads, admit on the engine thread)",
              "target_ratio_at_4": TARGET, "warm_up": warm, "streams": rows,
              "video_processing": engine.host.vision.model_dump(),
              "media_cache": stats.get("media_cache"), "steps": stats["steps"]}
    Path(a.out).write_text(json.dumps(result, indent=1))


def profile_one(engine, driver, loop, items: list[dict], again: list[dict], path: str) -> None:
    """One round of `items` under torch.profiler (host and GPU): its wall time and first sample, where its GPU
    time goes, how long the GPU waited after submission and, while it was idle, what the engine's thread was
    doing (examples/bench/gpu_idle.py); then the round `again` (fresh clips) counting the host calls that
    synchronised with the GPU; then the profiler's tables, written to `path`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from examples.bench.gpu_idle import aligned, annotated, busy_lines, idle_lines, synced, trace_events

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, annotated(engine) as spans:
        r = one_round(engine, driver, loop, items)
    events = trace_events(prof)
    events += aligned(spans, events)
    lines = [f"{len(items)} requests, round {r['wall_s'] * 1e3:.1f} ms; first sample: {r['samples'][0]}",
             *busy_lines(events), *idle_lines(events),
             "(the profiler starts just before the submission; its own overhead is in these times)"]
    if torch.cuda.is_available():       # the same round again, fresh clips, counting the host's syncs
        syncs: list[str] = []
        with synced(syncs):
            r = one_round(engine, driver, loop, again)
        lines += [f"the round again, unprofiled, under torch's sync debug mode: {r['wall_s'] * 1e3:.1f} ms", *syncs]
    head, ka = len(lines), prof.key_averages()
    lines += [ka.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70),
              ka.table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=70)]
    Path(path).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:head]), flush=True)


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan")
    ap.add_argument("out", metavar="OUT.json")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--gather-ms", type=float, default=None, help="the Driver's window for requests still preparing "
                    "(graphc run --gather-ms; default its 50 ms)")
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder (examples/tools/synthetic_tokenizer.py "
                    "writes one): models whose clips carry their frames' times as text (Qwen3.5) need one")
    ap.add_argument("--emulate", action="store_true", help="boot a plan for a smaller card of the same arch")
    ap.add_argument("--video-pixels", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                    help="the processor's pixel bounds over a whole clip (a checkpoint's video_preprocessor_config "
                    "size.shortest_edge and longest_edge); default the checkpoint's, or HF's class defaults "
                    "(131072 786432) without one. Qwen3.5's checkpoints reportedly ship 4096 25165824")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8], help="requests arriving at once")
    ap.add_argument("--seconds", type=float, nargs="+", default=[30.0], help="the clips' length; several: each "
                    "in turn on one boot, every stream count for each (seed 001's cells: 60 30 8)")
    ap.add_argument("--fps", type=float, default=2.0, help="each clip's frames a second")
    ap.add_argument("--size", type=int, nargs="+", default=[360, 640], help="the frames' height and width, or one side")
    ap.add_argument("--prompt", type=int, default=20, help="random text ids before the video")
    ap.add_argument("--tokens", type=int, default=16, help="tokens each request generates")
    ap.add_argument("--repeats", type=int, default=2, help="rounds per stream count, fresh clips each")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default=None, metavar="FILE", help="last, one more request alone under "
                    "torch.profiler: its GPU time, the GPU's wait after submission, the profiler's tables, to FILE")
    ap.add_argument("--profile-streams", type=int, default=1, metavar="N", help="--profile's round: N requests "
                    "submitted at once (the first --seconds), not one alone")
    ap.add_argument("--switch-interval", type=float, default=None, metavar="MS", help="Python's GIL hand-over "
                    "interval for the run (sys.setswitchinterval; default Python's 5 ms): whether the engine's thread "
                    "waits for the GIL behind the threads preparing clips")
    return ap.parse_args()


def main() -> None:
    a = arguments()
    if a.switch_interval is not None:
        if not 0 < a.switch_interval <= 1000:
            sys.exit(f"bench_video: --switch-interval is {a.switch_interval:g} ms: give one in (0, 1000]")
        sys.setswitchinterval(a.switch_interval / 1e3)
    from graphc.errors import InvalidInput
    from graphc.runtime.engine import Engine
    from graphc.serve.driver import Driver

    engine = Engine(a.plan, checkpoint=a.checkpoint, random_weights=a.random_weights, seed=a.seed, emulate=a.emulate,
                    tokenizer=a.tokenizer)
    print(engine.summary(), file=sys.stderr, flush=True)
    why = check(engine, a)
    if why is not None:
        engine.close()
        sys.exit(f"bench_video: {why}")
    set_video_pixels(engine, a.video_pixels)
    driver = Driver(engine, gather_ms=a.gather_ms)
    loop = asyncio.new_event_loop()      # one loop and its thread pool, as a server has
    draw, clip = id_source(engine, a.seed), clip_source(a, a.seed)
    try:
        warm = [one_round(engine, driver, loop, requests(engine, draw, clip, a, 1, seconds)) for seconds in a.seconds]
        rows = []
        for seconds in a.seconds:
            base = None
            for c in a.streams:
                rows.append(summarize(c, [one_round(engine, driver, loop, requests(engine, draw, clip, a, c, seconds))
                                          for _ in range(a.repeats)], base, a.tokens, seconds))
                base = base or (rows[-1] if c == 1 else None)
                save(a, engine, warm, rows)          # after each stream count: a run cut short keeps what it has
        if a.profile:
            profile_one(engine, driver, loop, requests(engine, draw, clip, a, a.profile_streams, a.seconds[0]),
                        requests(engine, draw, clip, a, a.profile_streams, a.seconds[0]), a.profile)
    except InvalidInput as e:              # the engine refused a request (a clip larger than the plan's walks)
        why = f"a request was refused: {e}"
    finally:
        driver.close()
        loop.close()
    if why is not None:
        engine.close()
        sys.exit(f"bench_video: {why}")
    engine.close()
    table(rows)


if __name__ == "__main__":
    main()
