"""Throughput of a plan served as `graphc run` serves it, in batches of requests that arrive at once: one
Engine for a plan of one copy, one per replica (graphc.runtime.replicas.Replicas) for a plan of several, so
a one-GPU plan and its two-replica plan are measured the same way.

    python examples/bench/bench_batches.py plans/qwen3_5_9b_2xh200.plan --random-weights \\
        --concurrency 16 32 64 128 --json $OUT/dp2.json
    python examples/bench/make_requests.py OUT/i2t.jsonl --t2t 0 --a2t 0 --i2t 50 --image-token 248056 \\
        --image-frame 248053 248054 --pattern gradient --max-tokens 128 --prompt 64
    python examples/bench/bench_batches.py plans/qwen3_5_9b_h200.plan --random-weights --requests OUT/i2t.jsonl \\
        --concurrency 16 32

Per concurrency c: c requests arrive at once (run_parsed, the path of `graphc run --requests`): --prompt
random token ids each generating --tokens tokens greedily with the end of turn ignored, or the next c lines
of --requests (as graphc run reads them). Reported: output tokens a wall second, TPOT p50 ((total - TTFT) /
(tokens - 1) per request), TTFT p50 and p95, the mean prompt rows, and on replicas the steps each ran. One
warm-up batch of 2 requests first.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def random_items(c: int, prompt: int, tokens: int, rng, vocab: int) -> list[dict]:
    from graphc.runtime.sampler import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    return [{"prompt_token_ids": rng.integers(0, vocab, prompt).tolist(), "params": params} for _ in range(c)]


def batch(engine, items: list) -> dict:
    c = len(items)
    before = [sum(e.stats()["steps"].values()) for e in getattr(engine, "engines", [engine])]
    t0 = time.perf_counter()
    outs = engine.run_parsed(items)
    wall = time.perf_counter() - t0
    after = [sum(e.stats()["steps"].values()) for e in getattr(engine, "engines", [engine])]
    ok = [o for o in outs if o.error is None and len(o.token_ids) > 1]
    tpot = [(o.times["total_s"] - o.times["ttft_s"]) / (len(o.token_ids) - 1) * 1e3 for o in ok]
    ttft = [o.times["ttft_s"] * 1e3 for o in ok]
    return {"c": c, "tokens_per_s": sum(len(o.token_ids) for o in outs) / wall, "wall_s": wall,
            "tpot_ms_p50": float(np.median(tpot)), "ttft_ms_p50": float(np.median(ttft)),
            "ttft_ms_p95": float(np.percentile(ttft, 95)), "steps_per_replica": [a - b for a, b in zip(after, before)],
            "prompt_rows_mean": sum(o.prompt_tokens for o in outs) / c,
            "errors": [o.error for o in outs if o.error][:3]}


def make_batches(a, ap, limits) -> list[list]:
    """A warm-up batch of 2, then one of each --concurrency: random prompts, or the lines of --requests in order."""
    sizes = [2] + a.concurrency
    if not a.requests:
        rng = np.random.default_rng(0)
        return [random_items(c, a.prompt, a.tokens if i else 8, rng, a.vocab)
                for i, c in enumerate(sizes)]
    from graphc.runtime.engine import parse_or_refuse, read_jsonl

    lines = read_jsonl(a.requests)
    if len(lines) < sum(sizes):
        ap.error(f"--requests holds {len(lines)} requests; the batches take {sum(sizes)}")
    parsed = iter([parse_or_refuse(x, i, limits) for i, x in enumerate(lines)])
    return [[next(parsed) for _ in range(c)] for c in sizes]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=150_000, help="prompt ids are drawn below this")
    ap.add_argument("--requests", default=None, metavar="IN.jsonl",
                    help="batches of these requests (graphc run's format)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from graphc.plan import load_plan
    from graphc.runtime.engine import Engine
    from graphc.runtime.replicas import Replicas

    plan = load_plan(a.plan)
    serving = Replicas if plan.replicas > 1 else Engine
    engine = serving(plan, a.checkpoint, random_weights=a.random_weights)
    print(engine.summary(), flush=True)
    batches = make_batches(a, ap, engine.media_limits())
    batch(engine, batches[0])
    rows = [batch(engine, b) for b in batches[1:]]
    print(f"{'c':>5} {'tok/s':>9} {'TPOT p50':>9} {'TTFT p50':>9} {'TTFT p95':>9} {'prompt':>7}  steps per replica")
    for r in rows:
        print(f"{r['c']:>5} {r['tokens_per_s']:>9.0f} {r['tpot_ms_p50']:>8.2f}ms {r['ttft_ms_p50']:>7.0f}ms "
              f"{r['ttft_ms_p95']:>7.0f}ms {r['prompt_rows_mean']:>7.0f}  {r['steps_per_replica']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"plan": a.plan, "summary": engine.summary(), "args": vars(a), "rows": rows}, f, indent=1)
    engine.close()


if __name__ == "__main__":
    main()
