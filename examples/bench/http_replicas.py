"""A served plan of replicas checked over HTTP: 64 concurrent /v1/completions, 16 of one prompt and 48 distinct
ones. Every answer must be 200; the 16 identical prompts, which the router spreads over the replicas, must get
identical tokens (each replica holds the same seeded weights); the walk steps come from /metrics.

    graphc run plans/qwen3_5_9b_2xh200.plan --random-weights --port 8011 &
    python examples/bench/http_replicas.py 8011 --model qwen3_5-9b
"""
from __future__ import annotations

import argparse
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def post(port: int, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.status, json.loads(r.read())


def wait_for(port: int, seconds: float = 600) -> None:
    end = time.time() + seconds
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except OSError:
            if time.time() > end:
                raise SystemExit(f"no server on port {port} after {seconds:.0f} s")
            time.sleep(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("port", type=int)
    ap.add_argument("--model", default="qwen3_5-9b")
    a = ap.parse_args()
    wait_for(a.port)
    same = [11 * j % 1000 + 100 for j in range(128)]
    common = {"model": a.model, "temperature": 0, "ignore_eos": True}
    bodies = [common | {"prompt": same, "max_tokens": 32} for _ in range(16)]
    bodies += [common | {"prompt": [(7 * i + 13 * j) % 5000 + 100 for j in range(128)], "max_tokens": 64}
               for i in range(48)]
    t0 = time.time()
    with ThreadPoolExecutor(len(bodies)) as pool:
        res = list(pool.map(lambda b: post(a.port, b), bodies))
    wall = time.time() - t0
    toks = [b["choices"][0]["token_ids"] for s, b in res if s == 200]
    print(f"{len(toks)} of {len(res)} answered 200 in {wall:.2f} s; {sum(map(len, toks))} tokens")
    alike = len(toks) == len(res) and all(t == toks[0] for t in toks[:16])
    print("the 16 identical prompts got identical tokens:", alike)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{a.port}/metrics").read().decode()
    print("\n".join(x for x in metrics.splitlines() if x.startswith(("graphc_walk_steps", "graphc_requests_total"))))


if __name__ == "__main__":
    main()
