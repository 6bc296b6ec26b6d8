"""Time one MoE layer's experts at the thinker's and the talker's real shapes: the torch
path (Experts.forward: sort, grouped_mm, gathers and scatters) against the fused Triton kernels
(models/components/moe_triton.py), each captured as a CUDA graph and replayed, at several token counts.
Also their error against an fp32 reference, and the bandwidth floor (the experts the tokens touch, read
once, at --bandwidth). Every time includes what the timing costs (two events and a graph launch): an
empty graph's replay, printed first and kept in the JSON.

    python examples/bench/bench_moe.py --json OUT.json [--tokens 1 2 4 8 16 32 64] [--replays 200]
    python examples/bench/bench_moe.py --sweep --tokens 128 512 2048 8192 --skew 0 4 --json OUT.json

--sweep times the tiled kernels (steps of more than moe_triton.TILED_FROM pairs) at each block choice of
SWEEP and keeps the fastest per row; --skew S adds S to 8 experts' router logits (most pairs then choose
them, as seeded weights' routers do), so that an expert chosen by many pairs is measured too.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from models.components.moe import Experts  # noqa: E402
from models.components.moe_ops import fused_experts  # noqa: E402

SHAPES = {"thinker": (128, 2048, 768, 8), "talker": (128, 1024, 384, 6)}   # experts, hidden, intermediate, top-k


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) tried for the tiled kernels by --sweep
SWEEP = [(64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3), (64, 64, 128, 4, 3),
         (32, 64, 128, 4, 4), (128, 64, 64, 4, 3), (64, 256, 64, 8, 3), (128, 128, 32, 8, 4), (64, 128, 32, 4, 4),
         # deeper pipelines and 8 warps over 128-row tiles (vLLM's tuned H200 choice at 2,048 tokens of this shape
         # is 128 x 256 x 64, 8 warps, 4 stages, over gate and up as one N)
         (128, 128, 64, 8, 4), (128, 64, 64, 8, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (64, 64, 64, 4, 5),
         (128, 256, 64, 8, 4), (64, 256, 64, 8, 4), (128, 64, 128, 8, 3), (64, 128, 128, 4, 3)]


def routing(t: int, e: int, k: int, hidden: int, gen: torch.Generator, skew: float = 0.0):
    """A router's top-k of softmax over random logits, renormalised, in bf16 (SparseMoE.route's order);
    skew is added to the first 8 experts' logits."""
    logits = torch.randn(t, e, generator=gen, device="cuda")
    logits[:, :8] += skew
    w, ex = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
    return ex, (w / w.sum(-1, keepdim=True)).to(torch.bfloat16)


def reference(x, gu, dn, ex, w) -> torch.Tensor:
    """fp32, expert by expert, from the bf16 values."""
    x, gu, dn, w = x.float(), gu.float(), dn.float(), w.float()
    out = torch.zeros_like(x)
    for e in ex.unique().tolist():
        tok, slot = (ex == e).nonzero(as_tuple=True)
        g, u = (x[tok] @ gu[e].T).chunk(2, dim=-1)
        out.index_add_(0, tok, (torch.nn.functional.silu(g) * u @ dn[e].T) * w[tok, slot][:, None])
    return out


def captured(fn, replays: int) -> float:
    """Median µs per replay of fn captured as a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    times.sort()
    return times[len(times) // 2]


def captured_per_call(fn, replays: int, calls: int = 16) -> float:
    """Median µs per call of fn, from a CUDA graph of `calls` calls (a small kernel's launch gaps as in a step)."""
    def many():
        for _ in range(calls):
            fn()
    return captured(many, replays) / calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--bandwidth", type=float, default=4.26e12)
    ap.add_argument("--json", default=None)
    ap.add_argument("--sweep", action="store_true", help="time the tiled kernels at each block choice of SWEEP")
    ap.add_argument("--skew", type=float, nargs="+", default=[0.0], help="router logit added to 8 experts")
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--no-tma", dest="tma", action="store_false",
                    help="the tiled kernels read the weights by pointers, not TMA descriptors")
    args = ap.parse_args()
    from models.components import moe_triton as mt
    mt.TMA = args.tma
    gen = torch.Generator(device="cuda").manual_seed(0)
    empty = captured(lambda: None, args.replays)      # what the timing itself costs: an empty graph's replay
    print(f"an empty graph replays in {empty:.1f} us (in every time below)")
    rows = []
    for name, (e, h, i, k) in ((n, SHAPES[n]) for n in args.shapes):
        ex_mod = Experts(e, h, i).to("cuda", torch.bfloat16)
        with torch.no_grad():
            ex_mod.gate_up_proj.normal_(0, 0.02, generator=gen)
            ex_mod.down_proj.normal_(0, 0.02, generator=gen)
        gu, dn = ex_mod.gate_up_proj.detach(), ex_mod.down_proj.detach()
        per_expert = (gu[0].numel() + dn[0].numel()) * 2
        for t, skew in [(t, sk) for t in args.tokens for sk in args.skew]:
            x = torch.randn(t, h, generator=gen, device="cuda").to(torch.bfloat16)
            ex, w = routing(t, e, k, h, gen, skew)
            with torch.no_grad():
                ref = reference(x, gu, dn, ex, w)
                a = ex_mod(x, ex, w)
                b = fused_experts(x, gu, dn, ex, w)
                err = lambda y: ((y.float() - ref).abs().max() / ref.abs().max()).item()  # noqa: E731
                row = {"shape": name, "tokens": t, "experts_touched": int(ex.unique().numel()),
                       "floor_us": ex.unique().numel() * per_expert / args.bandwidth * 1e6,
                       "torch_us": captured(lambda: ex_mod(x, ex, w), args.replays),
                       "fused_us": captured(lambda: fused_experts(x, gu, dn, ex, w), args.replays),
                       "torch_err": err(a), "fused_err": err(b), "skew": skew,
                       "most_pairs_one_expert": int(torch.bincount(ex.reshape(-1)).max())}
                if args.sweep and t * k > mt.TILED_FROM:
                    keep, keep_large = dict(mt.TILED), mt.TILED_LARGE
                    mt.TILED_LARGE = []                       # each choice at every size
                    best = {}
                    for kind in ("gate_up", "down"):
                        for cfg in SWEEP:
                            mt.TILED = {**mt.TILED, kind: cfg}
                            try:
                                us = captured(lambda: fused_experts(x, gu, dn, ex, w), args.replays)
                                e_ = err(fused_experts(x, gu, dn, ex, w))
                            except Exception as exc:       # a block choice past the shared memory, say
                                print(f"  {kind} {cfg}: {type(exc).__name__}", flush=True)
                                continue
                            row.setdefault("sweep", []).append({"kind": kind, "blocks": cfg, "us": us, "err": e_})
                            if kind not in best or us < best[kind][1]:
                                best[kind] = (cfg, us)
                        mt.TILED = {**mt.TILED, kind: best[kind][0]}      # the next kind swept with this one's best
                    row["best_blocks"] = {kd: v[0] for kd, v in best.items()}
                    row["fused_us"] = best["down"][1]
                    mt.TILED, mt.TILED_LARGE = keep, keep_large
            row["speedup"] = row["torch_us"] / row["fused_us"]
            rows.append(row)
            print(f"{name:8s} T={t:4d} skew {skew:g} (most {row['most_pairs_one_expert']}) "
                  f"{row.get('best_blocks', '')} experts {row['experts_touched']:3d}  torch {row['torch_us']:7.1f} us  "
                  f"fused {row['fused_us']:7.1f} us  x{row['speedup']:.2f}  floor {row['floor_us']:6.1f} us  "
                  f"err torch {row['torch_err']:.2e} fused {row['fused_err']:.2e}", flush=True)
    if args.json:
        import triton
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                               "tma": args.tma,
                                               "triton": triton.__version__, "empty_graph_us": empty,
                                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
