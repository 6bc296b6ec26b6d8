"""Per-graph growth of each capture pool at boot: pool bytes after every captured graph, in capture order.
    python docs/data/h100_2026-12-07e/pool_growth.py PLAN OUT.json [--lanes NAME]   (from the repository root; on a GPU)"""
import json, sys
from pathlib import Path
sys.path[:0] = ["examples/tools", "examples/bench", "."]
import torch
from graphc.runtime import gpu as G
from graphc.plan import load_plan

rows = {}
def capture_pool(self, comp, keys, bar=None):
    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream(self.boot.device)
    out_rows = rows.setdefault(comp, [])
    for node, family, rung in keys:
        step = self.boot.ir.family(node, family)
        inputs = self.static_inputs(node, family, step, rung)
        self.plan_step(self.backends[(node, family, rung)], step, rung)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            out = self.forward(node, family, step, rung, inputs)
        del out
        self.boot.graphs[f"{node}/{family}/{rung}"] = graph
        out_rows.append((f"{node}/{family}/{rung}", G.pool_bytes(pool)))
        if bar is not None:
            bar.update(1)
    self.boot.measured[comp] = G.pool_bytes(pool)

G.Graphs.capture_pool = capture_pool
from bench_steps import drop_kernels
from graphc.runtime.boot import boot_plan
if sys.argv[3:] and sys.argv[3] == "--lanes":
    from regen_plans import compile_shipped
    plan = compile_shipped(sys.argv[4], sections={"lanes": {"speak": True}})
else:
    plan = load_plan(sys.argv[1])
drop_kernels(plan, ["moe_sm90_from"])
(boot,) = boot_plan(plan, devices=[0], emulate=True)
Path(sys.argv[2]).write_text(json.dumps({"rows": rows, "measured": {k: v for k, v in boot.measured.items() if k.startswith("capture_pool")}}, indent=1))
for comp, r in rows.items():
    prev = 0
    for k, b in r:
        print(f"{comp:20s} {k:40s} {b:>14,} {b - prev:>+14,}"); prev = b
