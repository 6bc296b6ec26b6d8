"""Time a few tokens' MoE experts at the thinker's and the talker's real shapes: the grouped kernels
(moe_triton.py, the pairs grouped before the graph, as the router's launch groups them in a step) against a
program per pair (moe_pairs_triton.py) at each block choice of SWEEP, each captured as a CUDA graph of 16 calls
(a call's time as inside a step). Also each path's error against an fp32 reference and the bandwidth floor (the
experts touched, read once, at --bandwidth).

    python examples/bench/bench_moe_pairs.py OUT.json [--tokens 1 2 4] [--bandwidth 3.35e12]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import torch  # noqa: E402

from bench_moe import SHAPES, captured_per_call, reference, routing  # noqa: E402
from models.components import moe_pairs_triton as mp  # noqa: E402
from models.components.moe_ops import _group, fused_experts  # noqa: E402

# (BLOCK_N, BLOCK_K, warps) tried for each pair kernel
SWEEP = {"gate_up": [(1, 2048, 8), (2, 2048, 8), (4, 2048, 8), (2, 1024, 4), (4, 1024, 8), (8, 512, 4),
                     (2, 2048, 4), (4, 512, 4), (8, 256, 4)],
         "down": [(2, 1024, 4), (4, 1024, 4), (8, 1024, 8), (4, 512, 4), (8, 256, 4), (16, 256, 4), (2, 512, 2),
                  (8, 512, 4), (16, 128, 4)]}


def one_row(name: str, t: int, gen: torch.Generator, args) -> dict:
    """A shape at t tokens: the grouped path, then the pair path at every block choice (each kind swept with
    the other at its best so far), the fastest kept."""
    e, h, i, k = SHAPES[name]
    gu = torch.randn(e, 2 * i, h, generator=gen, device="cuda").mul_(0.02).to(torch.bfloat16)
    dn = torch.randn(e, h, i, generator=gen, device="cuda").mul_(0.02).to(torch.bfloat16)
    x = torch.randn(t, h, generator=gen, device="cuda").to(torch.bfloat16)
    res = torch.randn(t, h, generator=gen, device="cuda").to(torch.bfloat16)
    ex, w = routing(t, e, k, h, gen)
    grouped = _group(ex.reshape(-1).contiguous(), e)
    ref = reference(x, gu, dn, ex, w) + res.float()
    err = lambda y: ((y.float() - ref).abs().max() / ref.abs().max()).item()  # noqa: E731
    run_g = lambda: fused_experts(x, gu, dn, ex, w, res, grouped=grouped)  # noqa: E731
    run_p = lambda: fused_experts(x, gu, dn, ex, w, res, pair_tokens=t)  # noqa: E731
    row = {"shape": name, "tokens": t, "experts_touched": int(ex.unique().numel()),
           "floor_us": ex.unique().numel() * (gu[0].numel() + dn[0].numel()) * 2 / args.bandwidth * 1e6,
           "grouped_us": captured_per_call(run_g, args.replays), "grouped_err": err(run_g()), "sweep": []}
    keep = dict(mp.BLOCKS)
    best = {}
    for kind in ("gate_up", "down"):
        for cfg in SWEEP[kind]:
            mp.BLOCKS = {**mp.BLOCKS, kind: {0: cfg}}
            us = captured_per_call(run_p, args.replays)
            row["sweep"].append({"kind": kind, "blocks": cfg, "us": us, "err": err(run_p())})
            if kind not in best or us < best[kind][1]:
                best[kind] = (cfg, us)
        mp.BLOCKS = {**mp.BLOCKS, kind: {0: best[kind][0]}}
    row |= {"pair_us": best["down"][1], "pair_err": err(run_p()), "best_blocks": {kd: v[0] for kd, v in best.items()}}
    mp.BLOCKS = keep
    row["shipped_us"] = captured_per_call(run_p, args.replays)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--bandwidth", type=float, default=3.35e12)
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    with torch.no_grad():
        for name in args.shapes:
            for t in args.tokens:
                r = one_row(name, t, gen, args)
                rows.append(r)
                print(f"{name:8s} T={t:3d} experts {r['experts_touched']:3d}  grouped {r['grouped_us']:6.1f} us  "
                      f"pairs {r['pair_us']:6.1f} us {r['best_blocks']} (shipped blocks {r['shipped_us']:6.1f})  "
                      f"floor {r['floor_us']:5.1f} us  err {r['grouped_err']:.2e} / {r['pair_err']:.2e}", flush=True)
    import triton
    Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                           "triton": triton.__version__, "bandwidth": args.bandwidth,
                                           "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
