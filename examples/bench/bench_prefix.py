"""The prefix cache's effect on time to first token (TTFT): a repeated system prompt, and a conversation's
second turn, each against a cold prefill of a prompt of the same length. Targets: warm TTFT <= 25% of cold.

    python examples/bench/bench_prefix.py plans/qwen3_omni_h200.plan $OUT/prefix.json --random-weights \\
        --system-tokens 2000 --turn-tokens 128 --repeats 5
    python examples/bench/bench_prefix.py plans/tiny_cpu.plan /tmp/prefix.json --random-weights \\
        --system-tokens 200 --turn-tokens 16 --repeats 2          # CPU smoke check of the script only

One graphc.Engine with prefix_cache=True (the first replica's, for a plan of several). Prompts are token ids
(prompt_token_ids), drawn from --seed below min(vocab - 64, 150,000), never an end-of-turn or media
placeholder id. Every request runs alone, stepped until it is done, so its TTFT is its own prefill:
request.times["first_token"] - request.times["arrived"] (add() stamps the latter). Two warm-up requests first,
not counted: a fresh prompt, then its system rows again with another end (the cache-hit path); no measured
request shares their ids.

system_prompt: a system prompt of --system-tokens ids, then --suffix-tokens ids of a user turn, max_tokens 1.
  Its first request (the cache empty for it) is reported apart as first_ms; then --repeats requests, each
  the same system prompt with another suffix: warm. Cold: --repeats prompts of the same length whose ids
  are all fresh (nothing to reuse), interleaved with the warm ones.
second_turn: turn 1 is A = --system-tokens + --turn-tokens fresh ids, generating --gen-tokens tokens
  (end of turn ignored; not timed as a case); turn 2 is A + turn 1's tokens + --turn-tokens new ids,
  max_tokens 1: warm. Cold: a prompt of turn 2's length of fresh ids. --repeats times, each with a new A.

Per case: cold and warm TTFT medians and every sample (ms), warm / cold, prompt rows, and the prompt rows the
scheduler took from the cache (the engine's stats()["prefix_cache"]["hit_rows"] before and after each
request; 0 for a cold one). The results go to OUT.json with the plan, the environment and the date; a
table last. Plans whose LLM holds linear-attention state (Qwen3.5) never cache prefixes: refused.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TARGET = 0.25          # the bound on warm / cold TTFT


def id_source(engine, seed: int):
    """draw(n): n random prompt ids below the special ids, never an end-of-turn or media placeholder id."""
    vocab = engine.model.node(engine.llm).outputs["logits"].shape[-1]
    top = min(vocab - 64, 150_000)          # below the special and media placeholder ids of small and real vocabs
    avoid = set(engine.host.eos_token_ids) | set(getattr(engine.host, "token_of", {}).values())
    allowed = np.array([i for i in range(top) if i not in avoid])
    rng = np.random.default_rng(seed)
    return lambda n: rng.choice(allowed, n).tolist()


def alone(engine, ids: list[int], max_tokens: int = 1) -> dict:
    """One request run by itself until done: its TTFT (ms), prompt rows, rows taken from the cache, tokens."""
    from graphc.runtime.sampler import SamplingParams

    if engine.has_work():
        raise RuntimeError("the engine is busy: each request must run alone")
    hits = engine.stats()["prefix_cache"]["hit_rows"]
    req = engine.add(prompt_token_ids=ids, params=SamplingParams(temperature=0, max_tokens=max_tokens,
                                                                 ignore_eos=True))
    while engine.has_work():
        engine.step()
    out = engine.output(req)
    if out.error is not None or "first_token" not in req.times:
        raise RuntimeError(f"request {req.id} failed: {out.error or out.finish_reason}")
    return {"ms": (req.times["first_token"] - req.times["arrived"]) * 1e3, "prompt_rows": out.prompt_tokens,
            "cached_rows": engine.stats()["prefix_cache"]["hit_rows"] - hits, "token_ids": out.token_ids}


def warm_up(engine, draw, a) -> None:
    """A fresh prompt of the system case's length, then its system rows with another suffix (a cache hit)."""
    system = draw(a.system_tokens)
    alone(engine, system + draw(a.suffix_tokens))
    alone(engine, system + draw(a.suffix_tokens))


def system_prompt(engine, draw, a) -> dict:
    """The same system prompt with --repeats different suffixes (warm) against fresh prompts (cold)."""
    system = draw(a.system_tokens)
    first = alone(engine, system + draw(a.suffix_tokens))
    cold, warm = [], []
    for _ in range(a.repeats):
        cold.append(alone(engine, draw(a.system_tokens + a.suffix_tokens)))
        warm.append(alone(engine, system + draw(a.suffix_tokens)))
    return case(cold, warm) | {"first_ms": first["ms"], "first_cached_rows": first["cached_rows"]}


def second_turn(engine, draw, a) -> dict:
    """Turn 2 of --repeats conversations (warm) against fresh prompts of turn 2's length (cold)."""
    cold, warm, turn1 = [], [], []
    for _ in range(a.repeats):
        prompt = draw(a.system_tokens + a.turn_tokens)
        first = alone(engine, prompt, max_tokens=a.gen_tokens)
        turn1.append(first["ms"])
        ids = prompt + first["token_ids"] + draw(a.turn_tokens)
        warm.append(alone(engine, ids))
        cold.append(alone(engine, draw(len(ids))))
    return case(cold, warm) | {"turn1_ttft_ms": turn1}


def case(cold: list[dict], warm: list[dict]) -> dict:
    """Medians and samples of a case's cold and warm requests."""
    c, w = statistics.median(r["ms"] for r in cold), statistics.median(r["ms"] for r in warm)
    return {"prompt_rows": warm[0]["prompt_rows"], "cold_ms": c, "warm_ms": w, "ratio": w / c,
            "meets_target": w / c <= TARGET, "cold_samples_ms": [r["ms"] for r in cold],
            "warm_samples_ms": [r["ms"] for r in warm], "cached_rows": [r["cached_rows"] for r in warm],
            "cold_cached_rows": [r["cached_rows"] for r in cold]}


def check(engine, a) -> str | None:
    """Why the plan cannot run these cases (no prefix cache, or a request longer than it holds), else None."""
    if engine.scheduler.shared is None:
        return ("this plan's LLM holds linear-attention state slots, so its engine never caches prefixes "
                "(graphc/runtime/prefix_cache.py): nothing to measure; use a plan without them (Qwen3-Omni)")
    turn2 = a.system_tokens + 2 * a.turn_tokens + a.gen_tokens + 1        # its prompt and the token it samples
    longest = max(a.system_tokens + a.suffix_tokens + 1, turn2)
    kv, pages = engine.executor.kv_spec, engine.scheduler.capacity
    if longest > engine.max_seq_len or kv.pages_for(longest) > pages:
        return (f"the longest request holds {longest} rows (system prompt: --system-tokens + --suffix-tokens + 1 "
                f"= {a.system_tokens + a.suffix_tokens + 1}; second turn: --system-tokens + 2 x --turn-tokens + "
                f"--gen-tokens + 1 = {turn2}); this plan allows {engine.max_seq_len} rows a request "
                f"({kv.name}.max_seq_len) and {pages} pages of {kv.page_size}: lower those options")
    if min(a.repeats, a.system_tokens, a.suffix_tokens, a.turn_tokens, a.gen_tokens) < 1:
        return "--repeats and the token counts must be at least 1"
    return None


def environment() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    try:
        ours = version("graphc")
    except PackageNotFoundError:
        ours = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    cuda = torch.cuda.is_available()
    return {"gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda if cuda else None, "graphc": ours, "commit": commit,
            "python": platform.python_version(), "platform": platform.platform()}


def table(cases: dict) -> None:
    print(f"\n| case | prompt rows | cached rows | cold ms | warm ms | ratio | <= {TARGET} |")
    print("|---|---|---|---|---|---|---|")
    for name, c in cases.items():
        print(f"| {name} | {c['prompt_rows']} | {statistics.median(c['cached_rows']):.0f} | {c['cold_ms']:.1f} | "
              f"{c['warm_ms']:.1f} | {c['ratio']:.3f} | {'yes' if c['meets_target'] else 'no'} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan")
    ap.add_argument("out", metavar="OUT.json")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--emulate", action="store_true", help="boot a plan for a smaller card of the same arch")
    ap.add_argument("--system-tokens", type=int, default=2000)
    ap.add_argument("--suffix-tokens", type=int, default=32, help="the user turn after the repeated system prompt")
    ap.add_argument("--turn-tokens", type=int, default=128, help="each user turn of the conversation")
    ap.add_argument("--gen-tokens", type=int, default=64, help="the tokens turn 1 generates")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    from graphc.runtime.engine import Engine

    engine = Engine(a.plan, checkpoint=a.checkpoint, random_weights=a.random_weights, seed=a.seed,
                    emulate=a.emulate, prefix_cache=True)
    print(engine.summary(), file=sys.stderr, flush=True)
    why = check(engine, a)
    if why is not None:
        engine.close()
        sys.exit(f"bench_prefix: {why}")
    draw = id_source(engine, a.seed)
    warm_up(engine, draw, a)
    cases = {"system_prompt": system_prompt(engine, draw, a), "second_turn": second_turn(engine, draw, a)}
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
              "plan": a.plan, "summary": engine.summary(), "args": vars(a), "environment": environment(),
              "page_size": engine.executor.kv_spec.page_size, "target_ratio": TARGET, "cases": cases,
              "prefix_cache": engine.stats()["prefix_cache"], "steps": engine.stats()["steps"]}
    Path(a.out).write_text(json.dumps(result, indent=1))
    engine.close()
    table(cases)


if __name__ == "__main__":
    main()
