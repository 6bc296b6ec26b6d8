"""Aborts and saturation on a GPU against a booted plan with seeded weights (token ids only, no
tokenizer), through the server's own engine thread and HTTP routes, every graph captured.

    python examples/bench/reliability_gpu.py plans/qwen3_omni_h200.plan --out OUT

1. Alone: each distinct request (t2t, a2t, i2t, t2s; three of each) runs with the engine to itself:
   greedy token ids (and the talker's frames, seeded).
2. Aborts: 100 concurrent requests of those kinds; 10 drawn at random are cancelled at random points:
   t2t ones are streamed over HTTP (/v1/completions) and their client drops the socket, the others go
   through the server's Driver (the path a chat handler takes once its media are decoded) and are
   aborted after a random number of events. The 90 others must end as they should (length, or the
   talker's frames), and their token ids are compared with the alone run (equal, or where they part:
   bf16 kernels of other batch sizes need not round alike).
3. Saturation: with the engine held, 4 x what the pools hold at once plus 8 more are sent; the queue
   (max_waiting = 4 x) must take exactly 4 x, refuse 8 with 429 and Retry-After, serve the rest in order
   of arrival within each kind, and none may hang.
4. After: the leak oracle (every page of both pools free, no request state), the alone requests run
   again and must give the tokens of step 1 bit for bit (the graphs still replay and nothing was
   corrupted), and the GPU's allocated memory must be what it was after step 1.

Writes OUT/reliability.json and prints a table.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tests.unit.loopback import drop_after, post_json  # noqa: E402

KINDS = ("t2t", "a2t", "i2t", "t2s")


def requests_of(engine, variants: int, prompt: int, image_px=(200, 640), seed: int = 0) -> dict:
    """(kind, variant) -> engine.add kwargs: random prompt ids around one media placeholder."""
    from graphc import Media
    from graphc.runtime.speech import SpeechParams

    rng = np.random.default_rng(seed)
    vocab = engine.model.node(engine.llm).outputs["logits"].shape[-1]
    token_of = getattr(engine.host, "token_of", {})
    out = {}
    for kind in KINDS:
        if kind not in engine.kinds():
            continue
        for v in range(variants):
            ids = rng.integers(0, min([vocab - 8, 150_000, *token_of.values()]), prompt).tolist()   # no special ids
            kw = {"prompt_token_ids": ids, "media": []}
            if kind == "a2t":
                t = np.arange(int(rng.uniform(2, 6) * 16000)) / 16000
                kw["media"] = [Media("audio", (0.2 * np.sin(2 * np.pi * rng.uniform(150, 600) * t)).astype(np.float32))]
                kw["prompt_token_ids"] = ids[:prompt // 2] + [token_of["audio"]] + ids[prompt // 2:]
            elif kind == "i2t":
                h, w = (int(x) for x in rng.integers(*image_px, 2))
                kw["media"] = [Media("image", torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)))]
                kw["prompt_token_ids"] = ids[:prompt // 2] + [token_of["image"]] + ids[prompt // 2:]
            elif kind == "t2s":            # a user turn, then <|im_start|>assistant and a newline's stand-in
                sid = engine.host.speech.ids
                kw["prompt_token_ids"] = ([sid["im_start_token_id"], sid["user_token_id"]] + ids
                                          + [sid["im_start_token_id"], sid["assistant_token_id"], ids[0]])
                kw["speech"] = SpeechParams(seed=7, max_frames=24)
            out[(kind, v)] = kw
    return out


def params(max_tokens: int):
    from graphc.runtime.sampler import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, seed=7)


def alone(engine, reqs: dict, max_tokens: int) -> dict:
    out = {}
    for key, kw in reqs.items():
        req = engine.add(**kw, params=params(max_tokens))
        while not req.closed:
            engine.step()
        o = engine.output(req)
        out[key] = {"tokens": list(o.token_ids), "frames": len(o.audio_codes or []), "finish": o.finish_reason}
    return out


def parted(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (None: equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


async def drop_stream(port: int, ids: list[int], after_bytes: int, long: int) -> None:
    await drop_after(port, "/v1/completions", {"prompt": ids, "max_tokens": long, "temperature": 0, "stream": True,
                                               "ignore_eos": True}, after_bytes)


def long_tokens(engine, kw: dict) -> int:
    """max_tokens of a request meant to be cut: what its prompt leaves of the plan's longest (the media's rows
    counted generously)."""
    return engine.executor.kv_spec.max_seq_len - len(kw["prompt_token_ids"]) - 600


async def via_driver(driver, kw: dict, max_tokens: int, abort_after: int | None):
    """Submit as a chat handler does; abort after `abort_after` events. (tokens, frames, finish) or None."""
    long = long_tokens(driver.engine, kw)
    fut, events = driver.submit(asyncio.get_running_loop(), dict(kw, params=params(long if abort_after else max_tokens)))
    req = await fut
    n = 0
    while True:
        ev = await events.get()
        n += 1
        if abort_after is not None and n >= abort_after:
            driver.abort(req.id)
            return None
        if ev.finished:
            return list(req.output), len(req.speech.frames) if req.speech else 0, req.finish_reason


def aborts(engine, driver, port, reqs, want, n: int, cancel: int, max_tokens: int, seed: int) -> dict:
    rng = random.Random(seed)
    kinds = [k for k in KINDS if (k, 0) in reqs]
    keys = [(kinds[i % len(kinds)], i % 3) for i in range(n)]
    cut = set(rng.sample(range(n), cancel))

    async def one(i):
        key = keys[i]
        kw = reqs[key]
        if key[0] == "t2t":
            if i in cut:
                await drop_stream(port, kw["prompt_token_ids"], rng.randint(200, 4000), long_tokens(engine, kw))
                return None
            code, out, _ = await asyncio.to_thread(post_json, port, "/v1/completions",
                                                   {"prompt": kw["prompt_token_ids"], "max_tokens": max_tokens,
                                                    "temperature": 0, "ignore_eos": True, "seed": 7})
            assert code == 200, out
            return out["choices"][0]["token_ids"], 0, out["choices"][0]["finish_reason"]
        return await via_driver(driver, kw, max_tokens, rng.randint(2, 40) if i in cut else None)

    async def run():
        return await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    t0 = time.perf_counter()
    got = asyncio.run(asyncio.wait_for(run(), 1200))
    wall = time.perf_counter() - t0
    rows = {"n": n, "cancelled": sorted(cut), "wall_s": wall, "errors": [], "equal": 0, "parted": [], "frames_ok": 0}
    for i, out in enumerate(got):
        if isinstance(out, BaseException):
            rows["errors"].append(f"{i}: {type(out).__name__}: {out}")
            continue
        if i in cut:
            continue
        tokens, frames, finish = out
        w = want[keys[i]]
        at = parted(tokens, w["tokens"])
        if at is None:
            rows["equal"] += 1
        else:
            rows["parted"].append({"request": i, "kind": keys[i][0], "at": at, "of": len(w["tokens"])})
        rows["frames_ok"] += keys[i][0] != "t2s" or frames == w["frames"]
        if finish != "length" and keys[i][0] != "t2s":
            rows["errors"].append(f"{i}: finished '{finish}'")
    return rows


def saturation(engine, port, driver, reqs, max_tokens: int) -> dict:
    s = engine.scheduler
    rows_each = len(reqs[("t2t", 0)]["prompt_token_ids"]) + max_tokens
    hold = min(s.max_running, s.capacity // s.kv.pages_for(rows_each))
    queued, extra = 4 * hold, 8
    driver.max_waiting = queued
    go = threading.Event()
    step = engine.step

    def held():
        go.wait(120)
        return step()
    engine.step = held
    order = []
    watch = lambda ev: ev.finished and order.append((ev.request.kind, ev.request.arrival,  # noqa: E731
                                                     ev.request.times.get("first_token")))
    driver.observers.append(watch)
    bodies = [{"prompt": reqs[("t2t", i % 3)]["prompt_token_ids"], "max_tokens": max_tokens, "temperature": 0,
               "ignore_eos": True} for i in range(queued + extra)]
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(len(bodies)) as pool:          # every request in flight at once
            futures = [pool.submit(post_json, port, "/v1/completions", b, timeout=600) for b in bodies]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and driver.waiting() + sum(f.done() for f in futures) < len(bodies):
                time.sleep(0.05)
            go.set()
            answers = [f.result(timeout=900) for f in futures]
    finally:
        go.set()
        engine.step = step
        driver.observers.remove(watch)
    firsts = [f for _, _, f in sorted(order, key=lambda x: x[1])]
    codes = [a[0] for a in answers]
    return {"hold": hold, "sent": len(bodies), "max_waiting": queued, "served": codes.count(200),
            "refused_429": codes.count(429), "other": sorted(set(codes) - {200, 429}),
            "retry_after": sorted({a[2].get("retry-after") for a in answers if a[0] == 429}),
            "in_order": firsts == sorted(firsts), "wall_s": time.perf_counter() - t0}


def allocated() -> int | None:
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan")
    ap.add_argument("--out", required=True)
    ap.add_argument("--kernels", default=None, help="FlashInfer kernel tars to install first (examples/tools/boot_plans.py)")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--cancel", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=96)
    ap.add_argument("--image-px", type=int, nargs=2, default=(200, 640), help="image sides drawn in this range")
    ap.add_argument("--emulate", action="store_true")
    a = ap.parse_args()
    if a.kernels:
        from examples.tools.boot_plans import install_kernels
        install_kernels(a.kernels)
    from graphc.runtime.engine import Engine
    from tests.leak import held, released
    from tests.unit.loopback import serve

    t0 = time.perf_counter()
    engine = Engine(a.plan, random_weights=True, emulate=a.emulate)
    print(engine.summary(), flush=True)
    boot_s = time.perf_counter() - t0
    reqs = requests_of(engine, 3, a.prompt, a.image_px)
    want = alone(engine, reqs, a.max_tokens)
    mem0 = allocated()
    server, port = serve(engine, max_waiting=4 * a.n)
    driver = server.config.app.state.driver
    result = {"plan": a.plan, "boot_s": boot_s, "summary": engine.summary(), "kinds": sorted({k for k, _ in reqs})}
    print("aborts ...", flush=True)
    result["aborts"] = aborts(engine, driver, port, reqs, want, a.n, a.cancel, a.max_tokens, seed=15)
    result["leak_after_aborts"] = released(engine, 30)
    print("saturation ...", flush=True)
    result["saturation"] = saturation(engine, port, driver, reqs, a.max_tokens)
    result["leak_after_saturation"] = released(engine, 30)
    server.should_exit = True
    driver.thread.join(30)                     # the server's engine thread stops with it: the engine is ours again
    assert not driver.thread.is_alive(), "the server's engine thread did not stop"
    again = alone(engine, reqs, a.max_tokens)
    result["alone_again_equal"] = sum(again[k] == want[k] for k in want)
    result["alone_requests"] = len(want)
    result["allocated_bytes"] = {"after_alone": mem0, "after_all": allocated()}
    st = engine.stats()
    result["stats"] = {"replayed": st["replayed"], "eager": st["eager"], "steps": st["steps"],
                       "preemptions": st["preemptions"]}
    result["held_at_end"] = held(engine)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "reliability.json").write_text(json.dumps(result, indent=1, default=str))
    ab, sat = result["aborts"], result["saturation"]
    print(f"aborts: {ab['n']} requests, {len(ab['cancelled'])} cancelled, errors {len(ab['errors'])}, "
          f"{ab['equal']} of {ab['n'] - len(ab['cancelled'])} equal to alone, parted {len(ab['parted'])}, "
          f"{ab['wall_s']:.1f} s; leak after: {result['leak_after_aborts'] or 'none'}")
    print(f"saturation: {sat['sent']} sent, max_waiting {sat['max_waiting']}: served {sat['served']}, 429 "
          f"{sat['refused_429']} (Retry-After {sat['retry_after']}), other {sat['other']}, in order {sat['in_order']}, "
          f"{sat['wall_s']:.1f} s; leak after: {result['leak_after_saturation'] or 'none'}")
    print(f"after: alone again equal {result['alone_again_equal']}/{result['alone_requests']}, allocated "
          f"{result['allocated_bytes']}, node steps replayed {st['replayed']}, eager {st['eager']}")
    ok = (not ab["errors"] and not result["leak_after_aborts"] and not result["leak_after_saturation"]
          and sat["served"] == sat["max_waiting"] and sat["refused_429"] == sat["sent"] - sat["max_waiting"]
          and sat["in_order"] and result["alone_again_equal"] == result["alone_requests"])
    print("OK" if ok else "NOT OK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
