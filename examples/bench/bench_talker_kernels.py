"""The talker's small per-code kernels alone on the GPU: the fused sampler (graphc::select_codes)
at each of --warps, and beside it --baseline's (another version of models/components/select_triton.py, e.g.
`git show REV:models/components/select_triton.py > old.py`), checked to pick the same codes; and the code
predictor's frame attention on the 'triton' backend (resources/ragged_triton.py) against FlashInfer's fa3,
at the talker's shapes and 1 and 32 sampled rows. Each is a captured graph of 16 calls (as many as a talker
step makes), timed with CUDA events (median of replays); µs per call.

    python examples/bench/bench_talker_kernels.py --json OUT.json [--warps 2 4 8] [--baseline old.py]
        [--sampler-only]

The sampler's rows sample with the talker's defaults (temperature 0.9, top-k 50, top-p 0.8 for residual codes;
code 0 with repetition penalty 1.05 over a fifth of its ids and the codebook's suppression) on randn * 2.5
logits.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import torch  # noqa: E402

from bench_moe import captured_per_call  # noqa: E402

CALLS = 16


def sampler_rows(seqs: int, vocab: int, code0: bool):
    from models.components.talker import RowParams, sampling_row

    row = sampling_row(0.9, 50, 0.8, 1.05, 0.9, 50, 0.8)
    params = torch.tensor([row] * seqs, device="cuda")
    return RowParams(params[:, :4] if code0 else params[:, 4:], vocab)


def load_baseline(path: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location("select_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench_sampler(seqs: int, code0: bool, warps: list[int], baseline, replays: int) -> dict:
    from models.components import select_triton as k

    vocab = 3072 if code0 else 2048
    gen = torch.Generator(device="cuda").manual_seed(seqs)
    logits = (torch.randn(seqs, vocab, device="cuda", generator=gen) * 2.5)
    logits = logits if code0 else logits.bfloat16()
    rows = sampler_rows(seqs, vocab, code0)
    log_noise = torch.empty(seqs, vocab, device="cuda").exponential_(generator=gen).log()
    seen = (torch.rand(seqs, vocab, device="cuda", generator=gen) < 0.2) if code0 else None
    suppress = (torch.arange(vocab, device="cuda") >= 2048) if code0 else None
    out = torch.empty(seqs, dtype=torch.int64, device="cuda")
    args = (logits, rows.sampled, rows.temperature.float(), rows.kth.long(), rows.floor.float(),
            rows.penalty.float() if code0 else None, log_noise, seen, suppress, out)
    variants = {f"warps {w}": (lambda w=w: k.select_codes(*args, num_warps=w)) for w in warps}
    if baseline is not None:
        variants["baseline"] = lambda: baseline.select_codes(*args)
    codes, times = {}, {}
    for name, call in variants.items():
        times[name] = captured_per_call(call, replays, CALLS)
        codes[name] = out.tolist()
    first = next(iter(codes.values()))
    assert all(c == first for c in codes.values()), codes     # every variant picks the same codes
    return times


def code_predictor_attn():
    """The code predictor's frame attention as Qwen3-Omni declares it (16 query and 8 key heads of 128, causal
    16-row frames)."""
    from graphc.source import load_model

    return load_model(str(Path(__file__).resolve().parents[2] / "models/qwen3_omni.py"),
                      "30b-a3b").model.resource("code_predictor_attn")


def bench_frame_attention(seqs: int, replays: int) -> dict:
    from resources.base import StepShape
    from resources.flashinfer_backend import make_backend

    spec = code_predictor_attn()
    n = spec.rows_per_segment
    rung = StepShape(rows=n * seqs, seqs=seqs, kv_len=n)
    q, k, v = (torch.randn(rung.rows, h, spec.head_dim, device="cuda", dtype=torch.bfloat16)
               for h in (spec.num_heads, spec.kv_heads, spec.kv_heads))
    workspace = torch.zeros(64 * 2**20, dtype=torch.uint8, device="cuda")
    out = {}
    for name in ("triton", "fa3"):
        b = make_backend(spec, name, workspace, True, rung)
        b.plan([n * i for i in range(seqs + 1)])

        out[name] = captured_per_call(lambda b=b: b(q, k, v), replays, CALLS)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--warps", type=int, nargs="+", default=[4], help="the sampler's num_warps to time")
    ap.add_argument("--baseline", default=None, help="another select_triton.py to time beside it")
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--sampler-only", action="store_true", help="no frame attention rows (FlashInfer's fa3 "
                    "compiles for about a minute on a fresh machine)")
    a = ap.parse_args()
    baseline = load_baseline(a.baseline) if a.baseline else None
    rows = []
    for seqs in (1, 32):
        for code0 in (False, True):
            r = bench_sampler(seqs, code0, a.warps, baseline, a.replays)
            rows.append({"kernel": "select_codes", "code": "code 0" if code0 else "residual", "seqs": seqs, **r})
        if not a.sampler_only:
            rows.append({"kernel": "frame attention", "seqs": seqs, **bench_frame_attention(seqs, a.replays)})
    for r in rows:
        print("  ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                            "calls_per_graph": CALLS, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
