"""Paged decode on FlashInfer fa2 against this project's one-launch Triton kernel (resources/paged_triton.py), at
the Omni thinker's and talker's attention shapes, few to many sequences, short to long histories.

Each backend runs a captured graph of LAYERS layers' calls back to back (each layer its own pages of one pool,
as a decode step calls them; fa2 is three launches a layer: append, decode, merge), timed with CUDA events
(median of replays) and divided by LAYERS. Its error is one layer's output on another layout replayed through
the same graph against fp32 PagedTorch, and whether the step's K/V landed in the pages bit for bit.

    source .gpu/enter.sh && python examples/bench/bench_paged_decode.py OUT.json [--seqs 1 4 64] [--keys 256 8192]
        [--sweep BALANCE:STAGES:BLOCK ...]

--sweep: the Triton kernel again with each of its block choices (paged_triton's BALANCE, NUM_STAGES, BLOCK_N),
as variants named triton/BALANCE:STAGES:BLOCK.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import torch  # noqa: E402

from attention_gpu import (Case, capture, new_pool, page_tables, paged_layout, qkv, refill, rel_err,  # noqa: E402
                           replan, time_replays)
import resources.paged_triton as paged_triton  # noqa: E402
from resources.base import StepShape  # noqa: E402
from resources.flashinfer_backend import make_backend  # noqa: E402
from resources.paged_kv import PagedKVSpec, PagedTorch  # noqa: E402

SHAPES = {"thinker": (32, 4), "talker": (16, 2)}        # query heads, kv heads; head dim 128
LAYERS = 8


def one(case: Case, variant: str, workspace: torch.Tensor, rng: random.Random, replays: int) -> dict:
    backend, _, blocks = variant.partition("/")
    keep = paged_triton.BALANCE, paged_triton.NUM_STAGES, paged_triton.BLOCK_N
    if blocks:
        paged_triton.BALANCE, paged_triton.NUM_STAGES, paged_triton.BLOCK_N = map(int, blocks.split(":"))
    try:
        return timed_case(case, backend, workspace, rng, replays)
    finally:
        paged_triton.BALANCE, paged_triton.NUM_STAGES, paged_triton.BLOCK_N = keep


def timed_case(case: Case, backend: str, workspace: torch.Tensor, rng: random.Random, replays: int) -> dict:
    cache = new_pool(case)
    b = make_backend(case.spec, backend, workspace, True, case.rung, cache=cache, decode_backend=backend)
    full, other = paged_layout(rng, case, full=True), paged_layout(rng, case, full=False)
    full_tables, other_tables = page_tables(rng, case, full[1]), page_tables(rng, case, other[1])
    q, k, v = qkv(case)
    replan(b, *full, full_tables)
    graph, outs = capture(lambda: [b(layer, q, k, v) for layer in range(LAYERS)])
    refill(q, k, v)
    ref_cache = cache[:1].float()
    ref = PagedTorch(case.spec.model_copy(update={"dtype": "float32", "num_layers": 1}), ref_cache, *other,
                     other_tables)(0, q.float(), k.float(), v.float())
    replan(b, *other, other_tables)
    graph.replay()
    err, exact = rel_err(outs[0], ref), torch.equal(cache[0].float(), ref_cache[0])
    replan(b, *full, full_tables)
    return {"us": time_replays(graph, replays) / LAYERS, "rel_err": err, "append_exact": exact}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--seqs", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--keys", type=int, nargs="+", default=[256, 2048, 8192])
    ap.add_argument("--backends", nargs="+", default=["fa2", "triton"])
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--sweep", nargs="*", default=[], metavar="BALANCE:STAGES:BLOCK")
    args = ap.parse_args()
    args.backends += [f"triton/{v}" for v in args.sweep]
    workspace = torch.zeros(256 * 2**20, dtype=torch.uint8, device="cuda")
    rows = []
    for name, (hq, hkv) in SHAPES.items():
        for keys in args.keys:
            spec = PagedKVSpec(name=f"{name}_kv", num_layers=LAYERS, num_qo_heads=hq, num_kv_heads=hkv, head_dim=128,
                               max_seq_len=keys)
            for seqs in args.seqs:
                case = Case(f"{name}_decode", spec, StepShape(rows=seqs, seqs=seqs, kv_len=keys, phase="decode"))
                row = {"shape": name, "keys": keys, "seqs": seqs}
                for backend in args.backends:
                    row[backend] = one(case, backend, workspace, random.Random(f"{name}/{keys}/{seqs}"), args.replays)
                rows.append(row)
                print(f"{name:8s} keys {keys:5d} seqs {seqs:3d}: " + ", ".join(
                    f"{bk} {row[bk]['us']:7.2f} us (err {row[bk]['rel_err']:.1e}, append "
                    f"{'exact' if row[bk]['append_exact'] else 'WRONG'})" for bk in args.backends), flush=True)
    Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                           "layers": LAYERS, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
