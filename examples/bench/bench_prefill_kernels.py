"""Time, on the GPU, the small kernels of a long thinker prefill that the 2,048-token profile showed above their
memory floor, each captured as a CUDA graph of 16 calls and replayed (median us per call):

  - q and k's norm + rotary (norm_ops.q_k_norm_rope) at each ROPE_HEADS choice (heads a program, warps), at
    the thinker's shapes (32 q and 4 k heads of 128) and the code predictor's (16 and 8), rows 1 to 2,048;
    every choice's output is compared with the first's;
  - the grouping of token-expert pairs by expert past moe_ops.GROUP_SORT_FROM: torch's stable sort of the
    ids as bytes and a searchsorted against moe_count + moe_place, at
    the prefill sizes of the thinker (top-8) and the talker (top-6); both must give the same rows and ends;
  - the vision encoder's fp32 rotary of q and k (16 heads of 72) by the torch path and by q_k_rope_f32 (the
    fused_rope knob), at --patches rows; both must give the same bits. Then what runs before fa3 (which runs 72
    zero-padded to 128): the torch path and the backend's three pads, against one q_k_rope_f32 writing q, k
    and v padded; the launch at each VISION_ROPE_CHOICES (heads a program, warps);
  - a Gated DeltaNet layer's causal conv of an eager step at the Qwen3.5-9B's shapes: the torch path
    (delta_rule.causal_conv, which gathers each row's window as an fp32 [T, K, C] tensor) against
    norm_ops.gdn_conv_rows (the gdn_conv_rows knob); both must give the same bits.

    python examples/bench/bench_prefill_kernels.py --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_moe import captured_per_call  # noqa: E402

CALLS = 16
ROPE_CHOICES = [(1, 1), (2, 1), (2, 2), (4, 2), (4, 4), (8, 4), (8, 8), (16, 4), (16, 8), (32, 8)]
VISION_ROPE_CHOICES = [(1, 1), (2, 1), (4, 2), (4, 4), (8, 4), (16, 4), (16, 8)]
ROPE_SHAPES = {"thinker": (32, 4, 128), "code_predictor": (16, 8, 128)}
GROUP_SIZES = [("thinker", 65, 8), ("thinker", 512, 8), ("thinker", 2048, 8), ("talker", 1024, 6),
               ("thinker", 16384, 8)]


def per_call(fn, replays: int) -> float:
    return captured_per_call(fn, replays, CALLS)


def q_k_tables(n: int, hq: int, hk: int, d: int, table_dtype: torch.dtype, seed: int):
    """q [n, hq, d] and k [n, hk, d] as strided views of one bf16 projection [n, hq + 2 hk, d] (as the layers pass
    them), and rotate-half cos and sin [n, 1, d] of random angles in table_dtype."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(n, hq + 2 * hk, d, device="cuda", generator=gen).to(torch.bfloat16)
    ang = torch.rand(n, 1, d // 2, device="cuda", generator=gen) * 100
    cos, sin = (torch.cat([f(ang)] * 2, -1).to(table_dtype) for f in (torch.cos, torch.sin))
    return qkv[:, :hq], qkv[:, hq:hq + hk], cos, sin


def rope_rows(args) -> list[dict]:
    from models.components import norm_ops, norm_triton

    keep = norm_triton.ROPE_HEADS
    rows = []
    for name, (hq, hk, d) in ROPE_SHAPES.items():
        for n in args.rows:
            q, k, cos, sin = q_k_tables(n, hq, hk, d, torch.bfloat16, n)
            gen = torch.Generator(device="cuda").manual_seed(n + 1)
            wq, wk = (torch.randn(d, device="cuda", generator=gen).mul(0.2).add(1).to(torch.bfloat16) for _ in "qk")
            first = None
            for choice in ROPE_CHOICES:
                norm_triton.ROPE_HEADS = {"few": choice, "many": choice}
                yq, yk = norm_ops.q_k_norm_rope(q, k, wq, wk, cos, sin, 1e-6)
                if first is None:
                    first = (yq.clone(), yk.clone())
                ulp_rows = int(((yq != first[0]).any(-1)).sum() + ((yk != first[1]).any(-1)).sum())
                us = per_call(lambda: norm_ops.q_k_norm_rope(q, k, wq, wk, cos, sin, 1e-6), args.replays)
                floor = 2 * (hq + hk) * n * d * 2 / args.bandwidth * 1e6       # q and k read once and written
                rows.append({"kernel": "q_k_norm_rope", "shape": name, "rows": n, "heads_warps": list(choice),
                             "us": us, "floor_us": floor, "head_rows_unlike_first": ulp_rows})
                print(f"q_k_norm_rope {name:14s} rows {n:5d} heads/warps {choice}: {us:8.2f} us  (floor {floor:6.2f})"
                      f"  head rows unlike {ROPE_CHOICES[0]}: {ulp_rows}", flush=True)
    norm_triton.ROPE_HEADS = keep
    return rows


def vision_rope_rows(args) -> list[dict]:
    """The vision encoder's q and k rotary in fp32 (16 heads of 72): the torch path (VisionAttention without
    fused_rope) against norm_ops.q_k_rope_f32; both must give the same bits. With the pads to 128 that fa3 runs:
    the torch path and F.pad of q, k and v against q_k_rope_f32 writing the three padded, at each
    VISION_ROPE_CHOICES (heads a program, warps) for norm_triton.ROPE_F32_HEADS["many"]."""
    from models.components import norm_ops, norm_triton
    from models.components.layers import apply_rope

    pad = torch.nn.functional.pad
    keep = norm_triton.ROPE_F32_HEADS
    rows = []
    for n in args.patches:
        q, k, cos, sin = q_k_tables(n, 16, 16, 72, torch.float32, n)          # the vision tower: 16 heads of 72
        v = torch.randn_like(k)

        def torch_path():
            return apply_rope(q.float(), cos, sin).to(q.dtype), apply_rope(k.float(), cos, sin).to(k.dtype)

        def torch_padded():
            return tuple(pad(x, (0, 56)) for x in (*torch_path(), v))

        def fused_padded():
            return norm_ops.q_k_rope_f32(q, k, cos, sin, v=v, width=128)
        t_torch, t_torch_pad = per_call(torch_path, args.replays), per_call(torch_padded, args.replays)
        floor = 2 * 2 * n * 16 * 72 * 2 / args.bandwidth * 1e6          # q and k read and written once, bf16
        floor_pad = 3 * n * 16 * (72 + 128) * 2 / args.bandwidth * 1e6  # q, k, v read at 72, written at 128
        for choice in VISION_ROPE_CHOICES:
            norm_triton.ROPE_F32_HEADS = {**keep, "many": choice}
            same = all(torch.equal(a, b) for a, b in zip(torch_path(), norm_ops.q_k_rope_f32(q, k, cos, sin)))
            same = same and all(torch.equal(a, b) for a, b in zip(torch_padded(), fused_padded()))
            t_fused = per_call(lambda: norm_ops.q_k_rope_f32(q, k, cos, sin), args.replays)
            t_fused_pad = per_call(fused_padded, args.replays)
            rows.append({"kernel": "vision_rope", "patches": n, "heads_warps": list(choice), "torch_us": t_torch,
                         "fused_us": t_fused, "floor_us": floor, "torch_padded_us": t_torch_pad,
                         "fused_padded_us": t_fused_pad, "floor_padded_us": floor_pad, "same": same})
            print(f"vision rope {n:5d} patches, heads/warps {choice}: torch path {t_torch:8.2f} us  q_k_rope_f32 "
                  f"{t_fused:7.2f} us  (floor {floor:5.2f}); padded to 128 with v: torch + 3 pads {t_torch_pad:8.2f}"
                  f" us  one launch {t_fused_pad:7.2f} us (floor {floor_pad:5.2f})  same: {same}", flush=True)
            if not same:
                raise SystemExit("q_k_rope_f32 differs from the torch path")
    norm_triton.ROPE_F32_HEADS = keep
    return rows


def torch_group(flat: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The path before the counting sort: a stable sort of the ids as bytes, a searchsorted for the ends."""
    order, idx = torch.sort(flat.to(torch.uint8), stable=True)
    bounds = torch.arange(1, experts + 1, device=flat.device, dtype=torch.uint8)
    return idx.to(torch.int32), torch.searchsorted(order, bounds, out_int32=True)


def group_rows(args) -> list[dict]:
    from models.components import moe_ops

    rows = []
    for name, tokens, k in GROUP_SIZES:
        e = 128
        gen = torch.Generator(device="cuda").manual_seed(tokens)
        logits = torch.randn(tokens, e, device="cuda", generator=gen)
        logits[:, :8] += args.skew
        flat = torch.topk(logits, k, dim=-1).indices.reshape(-1).contiguous()
        p = flat.numel()
        _, nb = moe_ops.count_blocks(p)
        counts = torch.empty(nb, e, device="cuda", dtype=torch.int32)
        r = torch.empty(p, device="cuda", dtype=torch.int32)
        ends = torch.empty(e, device="cuda", dtype=torch.int32)

        def counting():
            moe_ops.moe_count(flat, counts)
            moe_ops.moe_place(flat, counts, r, ends)
        counting()
        want_rows, want_ends = torch_group(flat, e)
        same = bool(torch.equal(r, want_rows) and torch.equal(ends, want_ends))
        t_sort = per_call(lambda: torch_group(flat, e), args.replays)
        t_count = per_call(counting, args.replays)
        rows.append({"kernel": "group", "shape": name, "tokens": tokens, "pairs": p, "torch_sort_us": t_sort,
                     "counting_us": t_count, "same": same})
        print(f"group {name:8s} {tokens:6d} tokens ({p:6d} pairs): torch sort {t_sort:7.2f} us  counting sort "
              f"{t_count:7.2f} us  same: {same}", flush=True)
        if not same:
            raise SystemExit("the counting sort's rows or ends differ from torch's stable sort")
    return rows


def conv_rows(args) -> list[dict]:
    """A Gated DeltaNet layer's causal conv in an eager step at the Qwen3.5-9B's shapes (8,192 channels, 4 taps, a
    bf16 conv state pool of 64 slots): the torch path (read_slots, delta_rule.causal_conv, index_copy_ into the
    pool) against norm_ops.gdn_conv_rows (the gdn_conv_rows knob, in place), --conv-rows rows over 4 sequences of
    which the first starts from zeros. Both must give the same outputs and pool, bit for bit."""
    from models.components import norm_ops
    from models.components.delta_rule import causal_conv, read_slots

    rows, c, taps = [], 8192, 4
    for t in args.conv_rows:
        g = torch.Generator(device="cuda").manual_seed(t)
        x = torch.randn(t, c, device="cuda", generator=g).bfloat16()
        w = torch.randn(c, taps, device="cuda", generator=g).bfloat16()
        pool = torch.randn(64, c, taps - 1, device="cuda", generator=g).bfloat16()
        lens = [t // 4 + (i < t % 4) for i in range(4)]
        cu = [0] + [sum(lens[:i + 1]) for i in range(4)]
        slots = torch.tensor([7, 3, 50, 12], device="cuda")
        has = torch.tensor([False, True, True, True], device="cuda")
        seq = torch.repeat_interleave(torch.arange(4, dtype=torch.int32), torch.tensor(lens)).cuda()
        cu_t = torch.tensor(cu, device="cuda")
        p_torch, p_rows = pool.clone(), pool.clone()

        def torch_path():
            y, new = causal_conv(x, w, read_slots(p_torch, slots, has), cu)
            p_torch.index_copy_(0, slots, new.to(p_torch.dtype))
            return y

        def in_place():
            return norm_ops.gdn_conv_rows(x, w, p_rows, slots, has, seq, cu_t)
        y0, y1 = torch_path().float(), in_place().float()
        err = ((y1 - y0).abs().max() / y0.abs().max()).item()
        same = torch.equal(p_torch, p_rows)
        t_torch, t_rows = per_call(torch_path, args.replays), per_call(in_place, args.replays)
        floor = 2 * t * c * 2 / args.bandwidth * 1e6                  # x read and y written once, bf16
        rows.append({"kernel": "gdn_conv", "rows": t, "torch_us": t_torch, "conv_rows_us": t_rows, "floor_us": floor,
                     "rel_err": err, "pool_same": same})
        print(f"gdn conv {t:5d} rows: torch path {t_torch:9.1f} us  gdn_conv_rows {t_rows:7.1f} us  (floor "
              f"{floor:5.1f})  output rel. diff {err:.2e}, pool same: {same}", flush=True)
    return rows


BENCHES = {"rope": rope_rows, "group": group_rows, "vision_rope": vision_rope_rows, "conv": conv_rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 64, 512, 2048])
    ap.add_argument("--patches", type=int, nargs="+", default=[1024, 8192], help="vision rotary rows")
    ap.add_argument("--conv-rows", type=int, nargs="+", default=[512, 2048, 8192], help="the conv's step rows")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--skew", type=float, default=3.0, help="router logit added to 8 experts (seeded weights' skew)")
    ap.add_argument("--bandwidth", type=float, default=4.26e12)
    ap.add_argument("--only", nargs="+", choices=list(BENCHES), default=list(BENCHES), help="which benches to run")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_prefill_kernels times GPU kernels: no CUDA device here")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "calls_a_graph": CALLS,
           "rows": [row for name in args.only for row in BENCHES[name](args)]}
    if args.json:
        import triton
        out["triton"] = triton.__version__
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
