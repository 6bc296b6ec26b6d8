"""How much of a decode step the host adds: time per output token through graphc.Engine and through the HTTP
stream, against the captured replay of the same step, with the overlap of host work on and off
(graphc/runtime/flight.py), from one boot.

    python examples/bench/bench_overlap.py plans/qwen3_omni_h200.plan OUT.json --random-weights \\
        --concurrency 1 16 64 [--prompt 128] [--tokens 256] [--no-http]

Per concurrency c (c requests of --prompt random token ids arriving at once, --tokens tokens each, greedy, the
end of turn ignored):
  - replay: the LLM's captured decode graph at the smallest rung holding c sequences, each of its replays in
    the served run (overlap on) timed by CUDA events, median: the step's GPU time on the requests' own rows
    (replay_synthetic_ms: the same graph replayed alone on bench_steps.py's synthetic inputs, where a MoE's
    rows may route to fewer experts);
  - engine: the median gap between a request's consecutive tokens as engine.step() returns them (decode
    steady state: the prefill steps at the start, which no decode row can overlap, are left out of the median);
  - http: the same gap between a request's consecutive stream chunks, `graphc run`'s server (uvicorn, in this
    process) streaming /v1/completions to c client threads on loopback.
Each with the overlap on and off; the ratio of each to the replay is the issue's target (<= 1.05).
"""
from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "bench")]

from bench_engine import add_engine_args, prompt_ids  # noqa: E402


def replay_ms(engine, c: int, warmup: int = 20, replays: int = 100) -> tuple[str, float]:
    """The LLM's decode graph at the smallest captured rung holding c sequences: (its id, median ms)."""
    from bench_steps import prepare, time_graph

    walk = engine.scheduler.decode_walk
    family = engine.executor.steps[(engine.llm, walk)].family
    rung = min(r for r in engine.plan.nodes[engine.llm].buckets[walk].captured if r >= c)
    key = f"{engine.llm}/{family}/{rung}"
    prepare(engine.boot, key)
    return key, time_graph(engine.boot.graphs[key], warmup, replays)


class Timed:
    """A captured graph whose replays are timed by CUDA events (no host sync: read after the run)."""

    def __init__(self, graph, log: list):
        self.graph, self.log = graph, log

    def replay(self):
        import torch

        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        self.graph.replay()
        b.record()
        self.log.append((a, b))


def served_replay_ms(engine, key: str, run) -> tuple[float, dict]:
    """run() with graph `key`'s replays timed: (the median replay in ms, run()'s result). These are the
    served steps' own replays, on their own inputs (the MoE routes as the requests' rows do)."""
    import torch

    log, graph = [], engine.boot.graphs[key]
    engine.boot.graphs[key] = Timed(graph, log)
    try:
        out = run()
    finally:
        engine.boot.graphs[key] = graph
    torch.cuda.synchronize()
    return float(np.median([a.elapsed_time(b) for a, b in log])) if log else float("nan"), out


def gaps_ms(times: list[list[float]]) -> float:
    """Median gap between consecutive tokens over every request, the first gap of each left out."""
    gaps = [b - a for t in times for a, b in zip(t[1:], t[2:])]
    return float(np.median(gaps)) * 1e3 if gaps else float("nan")


def engine_run(engine, ids: list[list[int]], tokens: int) -> dict:
    from graphc.runtime.sampler import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    reqs = [engine.add(prompt_token_ids=p, params=params) for p in ids]
    times = {r.id: [] for r in reqs}
    t0 = time.perf_counter()
    while engine.has_work():
        events = engine.step()
        now = time.perf_counter()
        for ev in events:
            if ev.token_ids:
                times[ev.request.id].append(now)
    wall = time.perf_counter() - t0
    errors = [r.error for r in reqs if r.error]
    return {"tpot_ms": gaps_ms(list(times.values())), "tokens_per_s": sum(len(r.output) for r in reqs) / wall,
            "errors": errors[:3]}


def stream_one(port: int, model: str, ids: list[int], tokens: int) -> list[float]:
    """One streamed completion: the arrival time of each chunk that carries a choice."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": model, "prompt": ids, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp, times = conn.getresponse(), []
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    for line in resp:
        if line.startswith(b"data: {") and b'"choices": [{' in line:
            times.append(time.perf_counter())
    conn.close()
    return times


def http_run(port: int, model: str, ids: list[list[int]], tokens: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(ids)) as pool:
        times = list(pool.map(lambda p: stream_one(port, model, p, tokens), ids))
    wall = time.perf_counter() - t0
    return {"tpot_ms": gaps_ms(times), "tokens_per_s": sum(len(t) for t in times) / wall}


def start_server(engine) -> tuple[object, int]:
    import uvicorn

    from graphc.serve import build_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(engine), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, port


def measure(engine, a, rng) -> list[dict]:
    rows = []
    for c in a.concurrency:
        gpu = engine.boot.device.type == "cuda"
        key, ms = replay_ms(engine, c) if gpu else ("eager", float("nan"))
        row = {"c": c, "graph": key, "replay_synthetic_ms": ms}
        for on in (True, False):
            engine.overlap = on and engine.llm in engine.boot.nodes
            engine_run(engine, prompt_ids(engine, 1, a.prompt, rng), 8)          # warm: this concurrency's rungs
            ids = prompt_ids(engine, c, a.prompt, rng)
            if on and gpu:
                row["replay_ms"], res = served_replay_ms(engine, key, lambda: engine_run(engine, ids, a.tokens))
            else:
                res = engine_run(engine, ids, a.tokens)
            row[f"engine_{'on' if on else 'off'}"] = res
        row.setdefault("replay_ms", ms)
        rows.append(row)
    if not a.no_http:
        server, port = start_server(engine)
        for row in rows:
            for on in (True, False):
                engine.overlap = on and engine.llm in engine.boot.nodes
                row[f"http_{'on' if on else 'off'}"] = http_run(port, engine.model_name,
                                                                prompt_ids(engine, row["c"], a.prompt, rng), a.tokens)
        server.should_exit = True
    return rows


def table(rows: list[dict]) -> str:
    out = ["| c | graph | replay ms (synthetic) | engine on ms (x) | engine off ms (x) | http on ms (x) | http off ms (x) |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = []
        for k in ("engine_on", "engine_off", "http_on", "http_off"):
            t = r.get(k, {}).get("tpot_ms")
            cells.append("-" if t is None else f"{t:.2f} ({t / r['replay_ms']:.2f})")
        out.append(f"| {r['c']} | {r['graph']} | {r['replay_ms']:.2f} ({r['replay_synthetic_ms']:.2f}) | "
                   + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(ap)
    ap.add_argument("out")
    ap.add_argument("--no-http", action="store_true")
    a = ap.parse_args()
    import torch

    from graphc.runtime.engine import Engine

    engine = Engine(a.plan, checkpoint=a.checkpoint, random_weights=a.random_weights, emulate=a.emulate,
                    prefix_cache=False)
    rows = measure(engine, a, np.random.default_rng(a.seed))
    meta = {"plan": a.plan, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "prompt": a.prompt, "tokens": a.tokens, "command": " ".join(sys.argv)}
    Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
