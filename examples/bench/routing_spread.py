"""How many experts a captured thinker decode step's rows route to, per layer, on seeded weights:
the MoE part of a decode step of many sequences reads only the experts its rows touch, so its time says
as much about the routing as about the kernels.

    python examples/bench/routing_spread.py OUT.json [--plan plans/omni_2gpu.plan] [--device 1]

Boots the thinker's plan device, then runs the decode step eagerly at 1, 16 and 64 sequences on the
static inputs the captured graphs replay: first with the boot's token ids (zeros: every row the same
token), then with random ones (examples/bench/bench_steps.py vary_tokens), recording the distinct experts the
router picks in each layer, beside the count uniform routing would touch, E x (1 - (1 - k/E)^T).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "bench")]

import torch  # noqa: E402

from bench_steps import vary_tokens  # noqa: E402
from graphc.plan import load_plan  # noqa: E402
from graphc.runtime.boot import boot_plan  # noqa: E402
from models.components.moe import SparseMoE  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--plan", default=str(ROOT / "plans" / "omni_2gpu.plan"))
    ap.add_argument("--device", type=int, default=1)
    ap.add_argument("--node", default="thinker")
    ap.add_argument("--family", default="decode:seqs")
    a = ap.parse_args()
    (boot,) = boot_plan(load_plan(a.plan), devices=[a.device], emulate=True)
    g, node, fam = boot.runtime, a.node, a.family
    step = boot.ir.family(node, fam)
    decl, bufs = boot.ir.node(node), g.io[(node, fam)]
    moe = next(m for m in boot.modules[node].modules() if isinstance(m, SparseMoE))
    experts, top_k = moe.experts.num_experts, moe.top_k
    seen: list[int] = []
    route = SparseMoE.route

    def recording(self, x):
        e, w = route(self, x)
        seen.append(e.unique().numel())
        return e, w

    out = {}
    for ids in ("zeros", "random"):
        if ids == "random":
            vary_tokens(boot)
        for rung in (1, 16, 64):
            sizes = step.sizes_at(rung)
            inputs = {p: bufs[f"in.{p}"][:torch.Size(decl.inputs[p].concrete(sizes)).numel()]
                      .view(decl.inputs[p].concrete(sizes)) for p in step.inputs}      # the graphs' own inputs
            if ids == "zeros":
                inputs["token_ids"].zero_()
            seen.clear()
            SparseMoE.route = recording
            try:
                g.plan_step(g.backends[(node, fam, rung)], step, rung)
                with torch.inference_mode():
                    g.forward(node, fam, step, rung, inputs)
            finally:
                SparseMoE.route = route
            key = f"{ids} ids, {rung} seqs"
            out[key] = {"mean": sum(seen) / len(seen), "min": min(seen), "max": max(seen), "per_layer": list(seen),
                        "uniform": experts * (1 - (1 - top_k / experts) ** rung)}
            print(f"{key:22s} experts a layer: mean {out[key]['mean']:.1f}, min {out[key]['min']}, max "
                  f"{out[key]['max']}; uniform routing {out[key]['uniform']:.1f}", flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
