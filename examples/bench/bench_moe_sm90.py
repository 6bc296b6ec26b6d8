"""One MoE layer's expert GEMMs: graphc's Triton kernels (moe_triton's tiled gate_up and down) against
FlashInfer's SM90 CuTe-DSL grouped GEMMs (gather + SwiGLU, then down to each (token, slot) row, the
deterministic path), each captured as a CUDA graph and replayed, at the token counts given.

    python examples/bench/bench_moe_sm90.py --json OUT.json [--tokens 512 2048 8192] [--skew 0 3] [--shapes thinker talker]
    python examples/bench/bench_moe_sm90.py --sweep --tokens 2048 --skew 0 3 --json OUT.json

Needs an H200/H100 and FlashInfer's CuTe-DSL kernels (nvidia-cutlass-dsl). Both sides are given the same
grouping of the pairs (computed once, outside the timing) for the GEMM times; then the whole layer as
Experts.forward runs it (moe_ops.fused_experts with the residual: grouping, GEMMs, sum) each way, the SM90 side at
moe_sm90's tactics. --sweep times FlashInfer's tactics at --sweep-tokens and takes the best for that row. The
error of each against an fp32 reference (expert by expert from the same bf16 values) is printed beside.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_moe import SHAPES, captured, reference, routing  # noqa: E402


def grouping(ex: torch.Tensor, num_experts: int, tile: int):
    """FlashInfer's index maps for this routing and M tile, by torch ops: each expert's pairs (stable, by
    expanded index t * k + slot) padded to whole tiles."""
    from flashinfer.fused_moe.cute_dsl.moe_utils import get_max_num_tiles
    t, k = ex.shape
    flat = ex.reshape(-1)
    p = flat.numel()
    dev = ex.device
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + tile - 1) // tile * tile
    pstart = torch.cumsum(padded, 0) - padded
    tiles_e = padded // tile
    max_tiles = get_max_num_tiles(t, k, num_experts, tile)
    total = int(tiles_e.sum())
    tile_expert = torch.zeros(max_tiles, dtype=torch.int32, device=dev)
    tile_limit = torch.zeros(max_tiles, dtype=torch.int32, device=dev)
    tile_expert[:total] = torch.repeat_interleave(torch.arange(num_experts, device=dev), tiles_e).int()
    tile_limit[:total] = torch.repeat_interleave(pstart + counts, tiles_e).int()
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    rank = torch.arange(p, device=dev) - (torch.cumsum(counts, 0) - counts)[sorted_e]
    prow = pstart[sorted_e] + rank
    p2e = torch.zeros(max_tiles * tile, dtype=torch.int32, device=dev)
    p2e[prow] = order.int()
    return tile_expert, tile_limit, p2e, torch.tensor([total], dtype=torch.int32, device=dev), max_tiles * tile


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--skew", type=float, nargs="+", default=[0.0, 3.0])
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["thinker"])
    ap.add_argument("--sweep", action="store_true", help="sweep FlashInfer's tactics at --sweep-tokens")
    ap.add_argument("--sweep-tokens", type=int, default=2048, help="the token count the tactics are swept at")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from flashinfer.fused_moe.cute_dsl.sm90_contiguous_gather_grouped_gemm_act_fusion import (
        interleave_up_gate_sm90, sm90_contiguous_gather_grouped_gemm_act_fusion as gemm1)
    from flashinfer.fused_moe.cute_dsl.sm90_contiguous_grouped_gemm_finalize_fusion import (
        sm90_contiguous_grouped_gemm_finalize_fusion as gemm2)
    from models.components import moe_ops, moe_sm90
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows_out = []
    for shape in args.shapes:
        e, hdim, inter, k = SHAPES[shape]
        gu = (torch.randn(e, 2 * inter, hdim, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
        dn = (torch.randn(e, hdim, inter, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
        gu_i = interleave_up_gate_sm90(gu).contiguous()

        def cases():                      # the sweep's token count first: the others take its choice
            for t in sorted(args.tokens, key=lambda t: t != args.sweep_tokens):
                for skew in args.skew:
                    yield t, skew

        def ours(x, ex, w):
            flat = ex.reshape(-1).contiguous()
            p = flat.numel()
            rows = torch.empty(p, device="cuda", dtype=torch.int32)
            ends = torch.empty(e, device="cuda", dtype=torch.int32)
            counts = torch.empty(moe_ops.count_blocks(p)[1], e, device="cuda", dtype=torch.int32)
            moe_ops.moe_count(flat, counts)
            moe_ops.moe_place(flat, counts, rows, ends)
            h = torch.empty(p, inter, device="cuda", dtype=torch.bfloat16)
            pairs = torch.empty(p, hdim, device="cuda", dtype=torch.bfloat16)
            wf = w.reshape(-1).contiguous()

            def run():
                moe_ops.moe_gate_up(x, gu, h, rows, ends, k)
                moe_ops.moe_down(h, dn, pairs, rows, ends, wf)
            return run, lambda: pairs.view(-1, k, hdim).float().sum(1)

        def theirs(x, ex, w, tile, t1, t2):
            te, tl_, p2e, num, pm = grouping(ex, e, tile)
            h = torch.empty(pm, inter, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(ex.numel(), hdim, device="cuda", dtype=torch.bfloat16)
            scales = w.float().contiguous()

            def run1():
                gemm1(x, gu_i, te, tl_, p2e, num, out=h, topk=k, permuted_m=pm, tile_shape_mn=(tile, t1[0]),
                      swizzle_size=t1[1])

            def run2():
                gemm2(h, dn, te, tl_, p2e, num, scales, out, topk=k, use_fused_finalize=False,
                      tile_shape_mn=(tile, t2[0]), cluster_shape_mn=t2[1], raster_along_m=t2[2])

            def run():
                run1()
                run2()
            return run, run1, run2, lambda: (out.view(-1, k, hdim).float() * w.float()[..., None]).sum(1)

        for t, skew in cases():
            x = torch.randn(t, hdim, generator=gen, device="cuda").to(torch.bfloat16)
            ex, w = routing(t, e, k, hdim, gen, skew)
            ref = reference(x, gu, dn, ex, w)
            err = lambda y: ((y - ref).abs().max() / ref.abs().max()).item()  # noqa: E731
            run, result = ours(x, ex, w)
            run()
            row = {"shape": shape, "tokens": t, "skew": skew, "ours_us": captured(run, args.replays),
                   "ours_err": err(result()), "most_pairs_one_expert": int(torch.bincount(ex.reshape(-1)).max())}
            print(f"{shape} T={t} skew {skew:g}: triton gate_up+down {row['ours_us']:.1f} us "
                  f"(err {row['ours_err']:.2e})", flush=True)
            if t == args.sweep_tokens and args.sweep:
                tactics1 = [(tile, (n, s)) for tile in (128, 64) for n in (64, 128, 256) for s in (1, 8, 16)]
                tactics2 = [(tile, (n, c, r)) for tile in (128, 64) for n in (128, 256)
                            for c in ((1, 1), (1, 2)) for r in (False, True)]
                row["sweep"] = []

                def sweep(gemm: int, tactics, runner):
                    """Time each (tile, tactic) of one GEMM; the best tactic and its us per tile."""
                    best = {}
                    for tile, tac in tactics:
                        t0 = time.time()
                        try:
                            us = captured(runner(tile, tac), args.replays)
                        except Exception as exc:        # a tactic the kernel cannot implement at this shape
                            print(f"  gemm{gemm} tile {tile} {tac}: {type(exc).__name__}: {str(exc)[:200]}",
                                  flush=True)
                            continue
                        row["sweep"].append({"gemm": gemm, "tile": tile, "tactic": tac, "us": us})
                        print(f"  gemm{gemm} tile {tile} {tac}: {us:.1f} us (built in {time.time() - t0:.0f} s)",
                              flush=True)
                        if tile not in best or us < best[tile][1]:
                            best[tile] = (tac, us)
                    return best

                best1 = sweep(1, tactics1, lambda tile, tac: theirs(x, ex, w, tile, tac, (128, (1, 1), False))[1])
                best2 = sweep(2, tactics2, lambda tile, tac: theirs(x, ex, w, tile,
                                                                     best1.get(tile, ((128, 1), 0))[0], tac)[2])
                chosen = min((tile for tile in best1 if tile in best2),
                             key=lambda tile: best1[tile][1] + best2[tile][1], default=None)
                row["chosen"] = None if chosen is None else {"tile": chosen, "gemm1": best1[chosen][0],
                                                             "gemm2": best2[chosen][0]}
                if "chosen" not in vars(args):         # the other token counts take the first skew's choice
                    args.chosen = row["chosen"]
                print(f"  chosen: {row['chosen']}", flush=True)
            chosen = row.get("chosen") or getattr(args, "chosen", None) or {
                "tile": moe_sm90.TILE, "gemm1": (moe_sm90.GEMM1[0][1], moe_sm90.GEMM1[1]),
                "gemm2": (moe_sm90.GEMM2[0][1], moe_sm90.GEMM2[1], moe_sm90.GEMM2[2])}
            run, run1, run2, result = theirs(x, ex, w, chosen["tile"], chosen["gemm1"], chosen["gemm2"])
            run()
            # the whole layer as Experts.forward runs it (grouping, GEMMs, the scaled sum with the residual):
            # the Triton kernels on gate-then-up rows, the SM90 ones (moe_sm90's tactics) on interleaved rows
            res = torch.randn(t, hdim, generator=gen, device="cuda").to(torch.bfloat16)
            layer_t = lambda: moe_ops.fused_experts(x, gu, dn, ex, w, residual=res)  # noqa: E731
            layer_s = lambda: moe_ops.fused_experts(x, gu_i, dn, ex, w, residual=res,  # noqa: E731
                                                    interleave=moe_sm90.INTERLEAVE, sm90_from=1)
            ref_res = ref + res.float()
            row.update({"layer_triton_us": captured(layer_t, args.replays),
                        "layer_sm90_us": captured(layer_s, args.replays),
                        "layer_triton_err": ((layer_t().float() - ref_res).abs().max() / ref_res.abs().max()).item(),
                        "layer_sm90_err": ((layer_s().float() - ref_res).abs().max() / ref_res.abs().max()).item()})
            print(f"{shape} T={t} skew {skew:g}: whole layer triton {row['layer_triton_us']:.1f} us "
                  f"(err {row['layer_triton_err']:.2e}), sm90 {row['layer_sm90_us']:.1f} us "
                  f"(err {row['layer_sm90_err']:.2e})", flush=True)
            row.update({"sm90_us": captured(run, args.replays), "sm90_gemm1_us": captured(run1, args.replays),
                        "sm90_gemm2_us": captured(run2, args.replays), "sm90_err": err(result()),
                        "sm90_tactic": chosen})
            print(f"{shape} T={t} skew {skew:g}: sm90 {row['sm90_us']:.1f} us (gemm1 {row['sm90_gemm1_us']:.1f}, "
                  f"gemm2 {row['sm90_gemm2_us']:.1f}; err {row['sm90_err']:.2e}) against triton {row['ours_us']:.1f}",
                  flush=True)
            rows_out.append(row)
            if args.json:
                Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                       "torch": torch.__version__, "rows": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
