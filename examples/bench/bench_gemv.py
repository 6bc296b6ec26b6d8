"""The one-row linear kernel (models/components/gemv_triton.py) against cuBLAS (torch.mm) at Qwen3-Omni's
decode shapes on the GPU: each shape's weight in enough copies to pass the L2 cache (as a step's layers
do), a captured graph of one product per copy, timed with CUDA events (median of replays); a sweep of the
kernel's blocks (every one recorded), the configured choice (gemv_triton.config), and the error of each
against an fp32 product.

    python examples/bench/bench_gemv.py --json OUT.json [--quick]
    python examples/bench/bench_gemv.py --swiglu --json OUT.json
    python examples/bench/bench_gemv.py --rows 16 4 --json OUT.json [--quick] [--qwen3-5]

Prints per shape: cuBLAS us and TB/s, the configured blocks' us and TB/s, and the sweep's best. --swiglu: at
the one-row MLPs' shapes, the gate_up gemv then norm_ops.silu_mul (two launches, as the gemv knob runs them)
against gemv_silu_mul (one launch, the gemv_swiglu knob), captured the same way. --rows M ..: at each shape
and row count, cuBLAS (torch.mm) against gemm_rows (the few-rows kernel on the tensor cores) with its
configured blocks and a sweep of ROWS_SWEEP.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import torch  # noqa: E402

from bench_moe import captured  # noqa: E402

# (name, N, K): out features, in features
SHAPES = [("cp.qkv", 4096, 1024), ("cp.o", 1024, 2048), ("cp.gate_up", 6144, 1024), ("cp.down", 1024, 3072),
          ("cp.lm_head", 2048, 1024), ("talker.qkv", 2560, 1024), ("talker.shared_gate_up", 1536, 1024),
          ("talker.shared_down", 1024, 768), ("talker.codec_head", 3072, 1024),
          ("talker.text_projection.fc1", 2048, 2048), ("thinker.qkv", 5120, 2048), ("thinker.o", 2048, 4096),
          ("thinker.router", 128, 2048), ("thinker.lm_head", 152064, 2048)]
# --qwen3-5: Qwen3.5-9B's, a Gated DeltaNet layer's stacked in_proj (qkv, z, b, a) and out_proj, a full-attention
# layer's stacked q (with its gate), k and v, the MLP's stacked gate_up and down
QWEN3_5_SHAPES = [("qwen3_5_9b.gdn_in", 12352, 4096), ("qwen3_5_9b.gdn_out", 4096, 4096),
                  ("qwen3_5_9b.attn_qkv", 10240, 4096), ("qwen3_5_9b.gate_up", 24576, 4096),
                  ("qwen3_5_9b.down", 4096, 12288)]
# (name, I, K): a SwiGLU's intermediate and hidden sizes (its gate_up weight is [2I, K])
SWIGLU = [("cp.mlp", 3072, 1024), ("talker.shared_expert", 768, 1024), ("shared_expert_768x2048", 768, 2048),
          ("qwen3_5_9b.mlp", 12288, 4096), ("qwen3_5_0.8b.mlp", 3584, 1024)]
SWEEP = list(itertools.product((1, 2, 4, 8, 16), (512, 1024, 2048, 4096), (4, 8)))
# gemm_rows: (BLOCK_N, BLOCK_K, num_warps, num_stages)
ROWS_SWEEP = list(itertools.product((16, 32, 64, 128), (64, 128, 256), (4,), (3, 4))) + \
    [(16, 512, 4, 3), (16, 512, 4, 4), (32, 512, 4, 3), (16, 256, 2, 4), (64, 128, 8, 4), (128, 128, 8, 4),
     (128, 256, 8, 3)]


def timed(fn, copies: int, replays: int = 20) -> float:
    """us per call of fn(i) for i over the copies, captured as one graph (bench_moe.captured)."""
    return captured(lambda: [fn(i) for i in range(copies)], replays) / copies


def swiglu_rows() -> list[dict]:
    """Per SWIGLU shape: us of the two launches and of the fused one, and the fused one's max difference."""
    from models.components import gemv_triton as gk
    from models.components.norm_ops import silu_mul

    out = []
    for name, i, k in SWIGLU:
        nbytes = 2 * i * k * 2
        copies = max(2, min(64, -(-200_000_000 // nbytes)))
        ws = [torch.randn(2 * i, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for _ in range(copies)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        gus = [torch.empty(1, 2 * i, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        ys = [torch.empty(1, i, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        two = timed(lambda j: (gk.gemv(x, ws[j], None, gus[j]), silu_mul(gus[j])), copies)
        one = timed(lambda j: gk.gemv_silu_mul(x, ws[j], ys[j]), copies)
        gk.gemv(x, ws[0], None, gus[0])
        gk.gemv_silu_mul(x, ws[0], ys[0])
        diff = (ys[0].float() - silu_mul(gus[0]).float()).abs().max().item()
        out.append({"shape": name, "i": i, "k": k, "two_launches_us": two, "fused_us": one, "max_diff": diff})
        print(f"{name:24s} {nbytes / 1e6:7.1f} MB  gemv + silu_mul {two:7.2f} us  fused {one:7.2f} us "
              f"({nbytes / one / 1e6:4.2f} TB/s)  max diff {diff:.3g}", flush=True)
    return out


def _fits(fn, copies: int) -> float | None:
    """timed(fn), or None where its blocks take more shared memory or registers than the card has."""
    from triton.runtime.errors import OutOfResources

    try:
        return timed(fn, copies)
    except OutOfResources:
        return None


def rows_rows(counts: list[int], quick: bool, shapes: list[tuple[str, int, int]]) -> list[dict]:
    """Per shape and row count: cuBLAS's us, gemm_rows' configured and swept us, and each one's max error
    against an fp32 product."""
    from models.components import gemv_triton as gk

    out = []
    for (name, n, k), m in itertools.product(shapes, counts):
        nbytes = n * k * 2
        copies = max(2, min(64, -(-200_000_000 // nbytes)))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ys = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        ref = x.float() @ ws[0].float().t()
        cublas = timed(lambda i: torch.mm(x, ws[i].t(), out=ys[i]), copies)
        err_cublas = (torch.mm(x, ws[0].t()).float() - ref).abs().max().item()
        sweep = {",".join(map(str, b)): _fits(lambda i: gk.gemm_rows(x, ws[i], None, ys[i], b), copies)
                 for b in ([] if quick else ROWS_SWEEP)}
        sweep = {b: us for b, us in sweep.items() if us is not None}
        conf = timed(lambda i: gk.gemm_rows(x, ws[i], None, ys[i]), copies)
        gk.gemm_rows(x, ws[0], None, ys[0])
        err = (ys[0].float() - ref).abs().max().item()
        best = min(sweep.items(), key=lambda kv: kv[1]) if sweep else None
        out.append({"shape": name, "m": m, "n": n, "k": k, "cublas_us": cublas, "configured_us": conf,
                    "configured": list(gk.rows_config(k)), "sweep_us": sweep, "err_cublas": err_cublas,
                    "err_rows": err})
        tb = lambda us: nbytes / us / 1e6                              # noqa: E731
        print(f"{name:28s} m={m:<3d} cuBLAS {cublas:7.2f} us {tb(cublas):4.2f} TB/s  configured {conf:7.2f} us "
              f"{tb(conf):4.2f} TB/s" + (f"  best {best[1]:7.2f} us ({best[0]})" if best else "")
              + f"  max err vs fp32 {err_cublas:.3g} / {err:.3g}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="no sweep: cuBLAS and the configured blocks only")
    ap.add_argument("--swiglu", action="store_true", help="the fused SwiGLU product against its two launches only")
    ap.add_argument("--rows", type=int, nargs="+", default=None, metavar="M",
                    help="gemm_rows against cuBLAS at these row counts (1-64) only")
    ap.add_argument("--qwen3-5", dest="qwen3_5", action="store_true",
                    help="with --rows: Qwen3.5-9B's decode shapes in place of Qwen3-Omni's")
    a = ap.parse_args()
    if a.qwen3_5 and not a.rows:
        sys.exit("--qwen3-5 picks the shapes of --rows; give --rows M .. with it")
    if not torch.cuda.is_available():
        sys.exit("bench_gemv needs a CUDA device")
    if a.rows:
        if not all(1 <= m <= 64 for m in a.rows):
            sys.exit(f"--rows {a.rows}: gemm_rows takes 1 to 64 rows")
        torch.manual_seed(0)
        rows = rows_rows(a.rows, a.quick, QWEN3_5_SHAPES if a.qwen3_5 else SHAPES)
        if a.json:
            Path(a.json).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                "gemm_rows": rows}, indent=1))
        return
    if a.swiglu:
        rows = swiglu_rows()
        if a.json:
            Path(a.json).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                "swiglu": rows}, indent=1))
        return
    from models.components import gemv_triton as gk

    torch.manual_seed(0)
    out = []
    for name, n, k in SHAPES:
        nbytes = n * k * 2
        copies = max(2, min(64, -(-200_000_000 // nbytes)))              # >= 200 MB: past the 50 MB L2
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ys = [torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        ref = x.float() @ ws[0].float().t()
        cublas = timed(lambda i: torch.mm(x, ws[i].t(), out=ys[i]), copies)
        err_cublas = (torch.mm(x, ws[0].t()).float() - ref).abs().max().item()
        sweep = {}
        for bn, bk, warps in ([] if a.quick else SWEEP):
            if bk > 2 * (1 << (k - 1).bit_length()) or bn * bk > 32 * 1024:
                continue
            sweep[f"{bn},{bk},{warps}"] = timed(lambda i: gk.gemv(x, ws[i], None, ys[i], (bn, bk, warps)), copies)
        conf = timed(lambda i: gk.gemv(x, ws[i], None, ys[i]), copies)
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        gk.gemv(x, ws[0], None, y)
        err = (y.float() - ref).abs().max().item()
        best = min(sweep.items(), key=lambda kv: kv[1]) if sweep else None
        out.append({"shape": name, "n": n, "k": k, "weight_mb": nbytes / 1e6, "cublas_us": cublas,
                    "configured": list(gk.config(n, k)), "configured_us": conf, "sweep_us": sweep,
                    "err_cublas": err_cublas, "err_gemv": err})
        tb = lambda us: nbytes / us / 1e6                              # noqa: E731
        print(f"{name:28s} {nbytes / 1e6:7.1f} MB  cuBLAS {cublas:7.2f} us {tb(cublas):4.2f} TB/s  "
              f"configured {conf:7.2f} us {tb(conf):4.2f} TB/s {gk.config(n, k)}"
              + (f"  best {best[1]:7.2f} us {tb(best[1]):4.2f} TB/s ({best[0]})" if best else "")
              + f"  max err vs fp32 {err_cublas:.3g} / {err:.3g}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                            "rows": out}, indent=1))


if __name__ == "__main__":
    main()
