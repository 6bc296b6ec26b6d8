"""How long planning takes: a fresh process's imports, the first plan (which pays torch's lazy
imports), a plan with every cache cleared (the compiler's own work), and a fully cached re-plan.

    python examples/bench_plan.py [MODEL.py] [--gpu h100] [--gpus 1] [--preset P] [--repeat 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

t_start = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphc import memo  # noqa: E402
from graphc.pipeline import compile_model  # noqa: E402
from graphc.source import load_model  # noqa: E402

t_imported = time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=str(ROOT / "models" / "tiny_omni.py"))
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--preset", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    src = load_model(args.model, args.preset)
    t0 = time.perf_counter()
    first = compile_model(src, args.gpu, args.gpus)
    t_first = time.perf_counter() - t0
    cold, warm, passes = [], [], {}
    for _ in range(args.repeat):
        memo.clear()
        t0 = time.perf_counter()
        res = compile_model(src, args.gpu, args.gpus)
        cold.append(time.perf_counter() - t0)
        for k, v in res.result.timings.items():
            passes.setdefault(k, []).append(v)
        t0 = time.perf_counter()
        compile_model(src, args.gpu, args.gpus)
        warm.append(time.perf_counter() - t0)
    graphs = sum(len(r) for n in first.plan.nodes.values() for r in n.graphs.values())
    print(f"model {src.model.name} on {args.gpus} x {args.gpu}: {graphs} captured graphs simulated")
    print(f"python imports (torch, graphc):             {t_imported - t_start:7.3f} s")
    print(f"first plan in this process (lazy imports):  {t_first:7.3f} s")
    print(f"plan, every cache cleared (median of {args.repeat}):   {statistics.median(cold):7.3f} s")
    print(f"re-plan, caches warm (median of {args.repeat}):        {statistics.median(warm):7.3f} s")
    for k, v in passes.items():
        print(f"  {k:18s} {statistics.median(v) * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
