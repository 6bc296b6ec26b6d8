"""A/B of the plan's fused MoE kernels inside the captured steps (issue 13): plans/qwen3_omni_2xh100.plan's
talker (device 0) and thinker (device 1) decode graphs booted with the plan's kernel choice, with its
kernels taken away (grouped_mm), and with them again, one after the other in one process on one GPU
(each device capped to its 80 GB card), timed as examples/bench_steps.py times them.

    python examples/ab_moe_steps.py OUT.json
"""
import sys, json, gc
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]
import torch
from bench_steps import time_graph
from graphc.plan import load_plan
from graphc.runtime.boot import boot_plan
out = {}
for device, node in ((0, "talker"), (1, "thinker")):
    for variant in ("fused", "grouped_mm", "fused again"):
        plan = load_plan(ROOT / "plans" / "qwen3_omni_2xh100.plan")
        if variant == "grouped_mm":
            for k, n in list(plan.nodes.items()):
                plan.nodes[k] = n.model_copy(update={"kernels": {}})
        (boot,) = boot_plan(plan, devices=[device], emulate=True)
        for rung in (1, 16, 32 if node == "talker" else 64):
            key = f"{node}/decode:seqs/{rung}"
            ms = time_graph(boot.graphs[key], 5, 30)
            out[f"{key} {variant}"] = ms
            print(f"{key:28s} {variant:12s} {ms:8.3f} ms", flush=True)
        del boot
        gc.collect(); torch.cuda.empty_cache()
json.dump(out, open(sys.argv[1], "w"), indent=1)
