"""Paged decode on FlashInfer fa2 with and without tensor cores, at the thinker's and the talker's shapes, few to
many sequences: one layer's captured call (the step's KV append and attention), as attention_gpu.py times it,
and its error against fp32 PagedTorch on another layout replayed through the same graph.

resources/capabilities.py decodes on the tensor-core (prefill) kernels once a kv head serves 5 query heads or
more (TENSOR_CORE_MIN_GROUP, vLLM's and SGLang's rule); this measures that rule per sequence count.

    source .gpu/enter.sh && python examples/bench/bench_decode_cores.py OUT.json [--seqs 1 4 16 64] [--keys 256 2048]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import torch  # noqa: E402

from attention_gpu import Case, paged_captured  # noqa: E402
from resources import capabilities  # noqa: E402
from resources.base import StepShape  # noqa: E402
from resources.paged_kv import PagedKVSpec  # noqa: E402

SHAPES = {"thinker": (32, 4), "talker": (16, 2)}        # query heads, kv heads; head dim 128


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--seqs", type=int, nargs="+", default=[1, 2, 4, 16, 64])
    ap.add_argument("--keys", type=int, nargs="+", default=[256, 2048])
    ap.add_argument("--replays", type=int, default=100)
    args = ap.parse_args()
    workspace = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    rows, keep = [], capabilities.TENSOR_CORE_MIN_GROUP
    for name, (hq, hkv) in SHAPES.items():
        for keys in args.keys:
            spec = PagedKVSpec(name=f"{name}_kv", num_layers=2, num_qo_heads=hq, num_kv_heads=hkv, head_dim=128,
                               max_seq_len=keys)
            for seqs in args.seqs:
                case = Case(f"{name}_decode", spec, StepShape(rows=seqs, seqs=seqs, kv_len=keys, phase="decode"))
                row = {"shape": name, "keys": keys, "seqs": seqs}
                for cores, group in (("tensor", 1), ("cuda", 10 ** 6)):
                    capabilities.TENSOR_CORE_MIN_GROUP = group
                    r = paged_captured(case, "fa2", workspace, random.Random(f"{name}/{keys}/{seqs}"), args.replays)
                    row[cores] = {"us": r["us_per_call"], "rel_err": r["rel_err"], "append_exact": r["append_exact"]}
                capabilities.TENSOR_CORE_MIN_GROUP = keep
                rows.append(row)
                print(f"{name:8s} keys {keys:5d} seqs {seqs:3d}: tensor cores {row['tensor']['us']:7.2f} us "
                      f"(err {row['tensor']['rel_err']:.1e}), CUDA cores {row['cuda']['us']:7.2f} us "
                      f"(err {row['cuda']['rel_err']:.1e})", flush=True)
    Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                           "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
