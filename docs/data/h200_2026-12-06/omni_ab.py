"""One Omni boot (the plan's kernels less moe_sm90_from: no cutlass-dsl needed), two A/Bs, arms interleaved:
speech (t2s at c=1 and 16) with and without the code2wav_mid walk; V2T (30 s clips, 1 and 4 streams) with and
without the page-locked staging of large host inputs."""
import argparse
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "examples", "bench"))
import numpy as np  # noqa: E402

import bench_speech as bs  # noqa: E402
import bench_video as bv  # noqa: E402
import graphc.runtime.executor as ex  # noqa: E402
from graphc.plan import load_plan  # noqa: E402
from graphc.runtime.engine import Engine  # noqa: E402
from graphc.serve.driver import Driver  # noqa: E402

path, out = sys.argv[1], sys.argv[2]
parts = sys.argv[3].split(",") if len(sys.argv) > 3 else ["speech", "video"]
plan = load_plan(path)
for k, n in list(plan.nodes.items()):
    plan.nodes[k] = n.model_copy(update={"kernels": {x: v for x, v in n.kernels.items() if x != "moe_sm90_from"}})
t0 = time.perf_counter()
engine = Engine(plan, random_weights=True)
res = {"plan": path, "boot_s": time.perf_counter() - t0, "summary": engine.summary(), "speech": [], "video": []}
print(f"booted in {res['boot_s']:.0f} s", flush=True)


def dump():
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if "speech" in parts:
    lane = engine.speech
    every = list(lane.chunk_walks)
    sa = argparse.Namespace(text_tokens=32, frames=100, prompt=32, seconds=4.0)
    rng = np.random.default_rng(0)
    bs.run(engine, "t2s", 1, 1, sa, rng)
    for arm in ("mid", "nomid", "mid", "nomid"):
        lane.chunk_walks = every if arm == "mid" else [w for w in every if w[1] != "code2wav_mid"]
        for c in (1, 16):
            row = bs.run(engine, "t2s", c, max(2 * c, 4), sa, rng)
            row = {k: v for k, v in row.items() if k not in ("frames", "text_tokens")} | {"arm": arm}
            res["speech"].append(row)
            print(f"| speech {arm} c={c} | audio-s/s {row['audio_s_per_s']:.1f} | TTFA p50 {row['ttfa_ms']['p50']:.0f}"
                  f" | RTF p50 {row['rtf_p50']:.3f} | steps {row['steps']}", flush=True)
            dump()
    lane.chunk_walks = every

if "video" in parts:
    sys.argv = ["bench_video.py", path, "/dev/null", "--random-weights", "--streams", "1", "4", "--seconds", "30",
                "--fps", "2", "--size", "360", "640", "--tokens", "16", "--repeats", "2"]
    a = bv.arguments()
    driver = Driver(engine, gather_ms=a.gather_ms)
    loop = asyncio.new_event_loop()
    draw, clip = bv.id_source(engine, 0), bv.clip_source(a, 0)
    keep = ex.staged
    bv.one_round(engine, driver, loop, bv.requests(engine, draw, clip, a, 1, 30.0))
    for arm in ("pin", "nopin", "pin", "nopin"):
        ex.staged = keep if arm == "pin" else (lambda t, block: t)
        base = None
        for c in (1, 4):
            row = bv.summarize(c, [bv.one_round(engine, driver, loop, bv.requests(engine, draw, clip, a, c, 30.0))
                                   for _ in range(2)], base, a.tokens, 30.0)
            base = base or row
            row.pop("rounds")
            res["video"].append(row | {"arm": arm})
            print(f"| v2t {arm} c={c} | TTFT p50 {row['ttft_ms_p50']:.0f} | engine {row['engine_ttft_ms_p50']:.0f}"
                  f" | prepared {row['prepared_ms_p50']:.0f} | ratio {row['ratio']:.2f}", flush=True)
            dump()
    ex.staged = keep
    driver.close()
    loop.close()
engine.close()
dump()
