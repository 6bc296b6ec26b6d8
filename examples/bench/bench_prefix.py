"""The prefix cache's effect on time to first token (TTFT): a repeated system prompt, and a conversation's
second turn, each against a cold prefill of a prompt of the same length. Targets: warm TTFT <= 25% of cold.
And the media cache's: an image shown again after other text, against a fresh image (no target).

    python examples/bench/bench_prefix.py plans/qwen3_omni_h200.plan $OUT/prefix.json --random-weights \\
        --system-tokens 2000 --turn-tokens 128 --repeats 5
    python examples/bench/bench_prefix.py plans/qwen3_omni_tiny_cpu.plan /tmp/prefix.json --random-weights \\
        --system-tokens 200 --turn-tokens 16 --repeats 2 --image-size 160 224   # CPU smoke check of the script

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

repeated_image: --suffix-tokens fresh ids then an image of --image-size H W random pixels, max_tokens 1, shown
  once (not timed), then again after other fresh ids: warm (no cached page reaches the image, so the LLM
  computes its rows; the media cache holds the vision encoder's, graphc/runtime/media_cache.py). Cold: a fresh
  image after fresh ids. --repeats times. Run where the plan's host takes images and has a media cache.

Per case: cold and warm TTFT medians and every sample (ms), warm / cold, prompt rows, the prompt rows the
scheduler took from the cache (the engine's stats()["prefix_cache"]["hit_rows"] before and after each
request; 0 for a cold one) and the media cache's hits (the same, summed over its encoders). The results go to OUT.json with the plan, the environment and the date; a
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


def counts(engine) -> tuple[int, int]:
    """(prompt rows taken from the prefix cache, media pieces served by the media caches) since boot."""
    st = engine.stats()
    return st["prefix_cache"]["hit_rows"], sum(c["hits"] for c in st.get("media_cache", {}).values())


def alone(engine, ids: list[int], max_tokens: int = 1, media=None) -> dict:
    """One request run by itself until done: its TTFT (ms), prompt rows, rows taken from the cache, media cache
    hits, tokens."""
    from graphc.runtime.sampler import SamplingParams

    if engine.has_work():
        raise RuntimeError("the engine is busy: each request must run alone")
    before = counts(engine)
    req = engine.add(prompt_token_ids=ids, media=media or [],
                     params=SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    while engine.has_work():
        engine.step()
    out = engine.output(req)
    if out.error is not None or "first_token" not in req.times:
        raise RuntimeError(f"request {req.id} failed: {out.error or out.finish_reason}")
    after = counts(engine)
    return {"ms": (req.times["first_token"] - req.times["arrived"]) * 1e3, "prompt_rows": out.prompt_tokens,
            "cached_rows": after[0] - before[0], "media_hits": after[1] - before[1], "token_ids": out.token_ids}


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


def repeated_image(engine, draw, a) -> dict:
    """An image shown again after other ids (warm: its encoder rows from the media cache) against a fresh one."""
    import torch

    from graphc.serving import Media

    rng, token = np.random.default_rng(a.seed + 2), engine.host.token_of["image"]

    def image() -> list:
        return [Media("image", torch.from_numpy(rng.integers(0, 256, (3, *a.image_size), dtype=np.uint8)))]
    cold, warm = [], []
    for _ in range(a.repeats):
        seen = image()
        alone(engine, draw(a.suffix_tokens) + [token], media=seen)
        warm.append(alone(engine, draw(a.suffix_tokens) + [token], media=seen))
        cold.append(alone(engine, draw(a.suffix_tokens) + [token], media=image()))
    return case(cold, warm, target=None)


def case(cold: list[dict], warm: list[dict], target: float | None = TARGET) -> dict:
    """Medians and samples of a case's cold and warm requests."""
    c, w = statistics.median(r["ms"] for r in cold), statistics.median(r["ms"] for r in warm)
    return {"prompt_rows": warm[0]["prompt_rows"], "cold_ms": c, "warm_ms": w, "ratio": w / c,
            "meets_target": None if target is None else w / c <= target, "cold_samples_ms": [r["ms"] for r in cold],
            "warm_samples_ms": [r["ms"] for r in warm], "cached_rows": [r["cached_rows"] for r in warm],
            "cold_cached_rows": [r["cached_rows"] for r in cold], "media_hits": [r["media_hits"] for r in warm],
            "cold_media_hits": [r["media_hits"] for r in cold]}


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
    print(f"\n| case | prompt rows | cached rows | media hits | cold ms | warm ms | ratio | <= {TARGET} |")
    print("|---|---|---|---|---|---|---|---|")
    for name, c in cases.items():
        meets = {None: "-", True: "yes", False: "no"}[c["meets_target"]]
        print(f"| {name} | {c['prompt_rows']} | {statistics.median(c['cached_rows']):.0f} | "
              f"{statistics.median(c['media_hits']):.0f} | {c['cold_ms']:.1f} | {c['warm_ms']:.1f} | "
              f"{c['ratio']:.3f} | {meets} |", flush=True)


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
    ap.add_argument("--image-size", type=int, nargs=2, default=(480, 640), metavar=("H", "W"),
                    help="the repeated_image case's pixels")
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
    if "image" in getattr(engine.host, "token_of", {}) and engine.executor.media:
        cases["repeated_image"] = repeated_image(engine, draw, a)
    else:
        print("bench_prefix: no repeated_image case: the plan's host takes no image or it has no media cache",
              file=sys.stderr, flush=True)
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
              "plan": a.plan, "summary": engine.summary(), "args": vars(a), "environment": environment(),
              "page_size": engine.executor.kv_spec.page_size, "target_ratio": TARGET, "cases": cases,
              "prefix_cache": engine.stats()["prefix_cache"], "media_cache": engine.stats().get("media_cache"),
              "steps": engine.stats()["steps"]}
    Path(a.out).write_text(json.dumps(result, indent=1))
    engine.close()
    table(cases)


if __name__ == "__main__":
    main()
