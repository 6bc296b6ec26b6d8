"""graphc.Engine's text decode speed on a plan: time per output token at several concurrencies, and the
first-audio latency of a spoken answer to audio (A2S) at one stream, from one boot.

    python examples/bench/bench_engine.py plans/qwen3_omni_h200.plan --random-weights --concurrency 1 16 64 \\
        --a2s --json $OUT/engine.json

T2T: per concurrency c, c requests of --prompt random token ids arrive at once, each generating --tokens
tokens greedily with the end of turn ignored; a request's time per output token (TPOT) is (its last token -
its first token) / (tokens - 1). Reported: TPOT p50 across the c requests, output tokens a wall second, and
the engine's mean wall time of a decode step (its stats' step_ms). One warm-up request first.
A2S (--a2s): bench_speech.py's A2S run at c=1 (its prompt, clip and frame budget), first audio p50.
The script runs on any graphc tree that has graphc.Engine, so one machine can measure two trees.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def prompt_ids(engine, c: int, n: int, rng) -> list[list[int]]:
    """c prompts of n random ids, below the special and media placeholder ids of small and real vocabularies."""
    vocab = engine.model.node(engine.llm).outputs["logits"].shape[-1]
    top = min(vocab - 64, 150_000)
    return [rng.integers(0, top, n).tolist() for _ in range(c)]


def add_engine_args(ap: argparse.ArgumentParser) -> None:
    """The plan, its weights and the t2t load: what the engine benches share."""
    ap.add_argument("plan")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--emulate", action="store_true", help="boot a plan for a smaller card of the same arch")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)


def t2t(engine, c: int, prompt: int, tokens: int, rng) -> dict:
    from graphc.runtime.sampler import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    before = dict(engine.scheduler.stats.steps)
    t0 = time.perf_counter()
    reqs = [engine.add(prompt_token_ids=ids, params=params) for ids in prompt_ids(engine, c, prompt, rng)]
    while engine.has_work():
        engine.step()
    wall = time.perf_counter() - t0
    outs = [engine.output(r) for r in reqs]
    tpot = [(r.times["finished"] - r.times["first_token"]) / (len(o.token_ids) - 1) * 1e3
            for r, o in zip(reqs, outs) if len(o.token_ids) > 1]
    st = engine.stats()
    decode = engine.scheduler.decode_walk
    steps = {w: n - before.get(w, 0) for w, n in st["steps"].items() if n - before.get(w, 0)}
    return {"c": c, "tpot_ms_p50": float(np.median(tpot)), "tokens_per_s": sum(len(o.token_ids) for o in outs) / wall,
            "ttft_ms_p50": float(np.median([o.times["ttft_s"] * 1e3 for o in outs])), "wall_s": wall,
            "decode_step_ms": st["step_ms"].get(decode), "steps": steps,
            "errors": [o.error for o in outs if o.error][:3]}


def a2s(engine, plan: str, rng) -> dict:
    """bench_speech.py's A2S run at c=1 (4 requests after one warm-up)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_speech

    args = bench_speech_args(plan)
    bench_speech.run(engine, "a2s", 1, 1, args, rng)
    row = bench_speech.run(engine, "a2s", 1, 4, args, rng)
    return {k: row[k] for k in ("ttfa_ms", "audio_s_per_s", "phases_ms_p50", "errors")}


def bench_speech_args(plan: str):
    return argparse.Namespace(plan=plan, text_tokens=32, frames=100, prompt=32, seconds=4.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(ap)
    ap.add_argument("--a2s", action="store_true", help="also A2S first audio at c=1")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from graphc.runtime.engine import Engine

    engine = Engine(a.plan, checkpoint=a.checkpoint, random_weights=a.random_weights, emulate=a.emulate)
    print(engine.summary(), file=sys.stderr)
    rng = np.random.default_rng(a.seed)
    t2t(engine, 1, a.prompt, 16, rng)                          # warm-up
    rows = [t2t(engine, c, a.prompt, a.tokens, rng) for c in a.concurrency]
    result = {"plan": a.plan, "summary": engine.summary(), "args": vars(a), "t2t": rows}
    if a.a2s:
        result["a2s_c1"] = a2s(engine, a.plan, rng)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    print("c\tTPOT p50 ms\ttokens/s\tdecode step ms\tTTFT p50 ms")
    for r in rows:
        print(f"{r['c']}\t{r['tpot_ms_p50']:.2f}\t{r['tokens_per_s']:.0f}\t{r['decode_step_ms'] or float('nan'):.2f}"
              f"\t{r['ttft_ms_p50']:.0f}")
    if a.a2s:
        print(f"A2S c=1 first audio p50 {result['a2s_c1']['ttfa_ms']['p50']:.0f} ms")


if __name__ == "__main__":
    main()
