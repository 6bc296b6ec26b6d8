"""How long `graphc plan` takes, whole process (imports included), as a user runs it:

    cold      an empty disk cache (graphc/memo.py): every step traced
    again     the same command once more: everything read from the cache
    --set     one walk's budget changed: only what that changes is computed again

    python examples/bench/bench_plan.py [MODEL.py] [--gpu h100] [--gpus 2] [--preset P] [--set KEY=VALUE]

The cache lives in a temporary directory of this run (removed after); each plan is checked byte for
byte against the cold one (the --set plan against a cold plan of its own, made with the cache off).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def plan(model: str, args, cache: str, out: Path, sets: list[str]) -> float:
    cmd = [sys.executable, "-m", "graphc.cli", "plan", model, "--gpu", args.gpu, "--gpus", str(args.gpus),
           "-o", str(out), "-q"] + (["--preset", args.preset] if args.preset else [])
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, GRAPHC_CACHE_DIR=cache), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"graphc plan failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="models/qwen3_omni.py")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--preset", default=None)
    ap.add_argument("--set", dest="change", default="walks.thinker_decode.budget.seqs=48",
                    help="the one change of the third plan (default: the thinker's decode budget)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cache = str(tmp / "cache")
        cold = plan(args.model, args, cache, tmp / "cold.plan", [])
        again = plan(args.model, args, cache, tmp / "again.plan", [])
        changed = plan(args.model, args, cache, tmp / "set.plan", [args.change])
        plan(args.model, args, "off", tmp / "set_ref.plan", [args.change])
        same = ((tmp / "cold.plan").read_bytes() == (tmp / "again.plan").read_bytes()
                and (tmp / "set.plan").read_bytes() == (tmp / "set_ref.plan").read_bytes())
        entries = sum(1 for _ in Path(cache).rglob("*.pkl"))
    print(f"{args.model} on {args.gpus} x {args.gpu}, whole process:")
    print(f"  cold (empty cache)          {cold:6.2f} s")
    print(f"  again (all cached)          {again:6.2f} s")
    print(f"  --set {args.change}: {changed:6.2f} s")
    print(f"  {entries} cache entries; plans byte-identical to uncached ones: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
