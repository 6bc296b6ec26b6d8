"""Regenerate the shipped plans in plans/ from their recorded inputs (tests/golden compiles them
again, in fresh processes and after other models, and compares byte for byte).

    python examples/tools/regen_plans.py                     # all, into plans/
    python examples/tools/regen_plans.py tiny_cpu            # one, by name
    python examples/tools/regen_plans.py --out DIR [NAME..]  # elsewhere, in the order given
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from graphc.overrides import load_config  # noqa: E402
from graphc.pipeline import compile_model  # noqa: E402
from graphc.source import load_model  # noqa: E402
from graphc.plan import Plan  # noqa: E402

SEED_80GB = "examples/configs/seed_80gb.yaml"

SHIPPED = {
    # name: (model file, preset, gpu, devices, overrides[, replicas: forced, else the compiler's choice])
    "tiny_cpu": ("models/tiny_omni.py", "tiny", "cpu", 1, {}),
    "tiny_h100": ("models/tiny_omni.py", "tiny", "h100", 1, {}),
    # one copy over two devices (a replica on each would run more): the plan that boots a split on two GPUs
    "tiny_small_2xh100": ("models/tiny_omni.py", "small", "h100", 2, {}, 1),
    "qwen3_omni_tiny_cpu": ("models/qwen3_omni.py", "tiny", "cpu", 1, {}),
    "omni_2gpu": ("models/qwen3_omni.py", "30b-a3b", "h100", 2, {}),
    "qwen3_omni_h200": ("models/qwen3_omni.py", "30b-a3b", "h200", 1, {}),
    "qwen3_asr_1.7b_h100": ("models/qwen3_asr.py", "1.7b", "h100", 1, {}),
    "qwen3_5_9b_h200": ("models/qwen3_5.py", "9b", "h200", 1, {}),
    "qwen3_5_9b_h100": ("models/qwen3_5.py", "9b", "h100", 1, {}),
    "qwen3_5_0.8b_h200": ("models/qwen3_5.py", "0.8b", "h200", 1, {}),
    "qwen3_5_9b_2xh200": ("models/qwen3_5.py", "9b", "h200", 2, {}),
    # one copy split over two tensor-parallel ranks (forced: two replicas run more requests at once)
    "qwen3_5_9b_2xh200_tp2": ("models/qwen3_5.py", "9b", "h200", 2, {"tp": 2}),
    # the seeds' 80 GB settings, trimmed by --fit until they fit one h100 (the trims are in the plan)
    "qwen3_omni_h100_seed80gb_fit": ("models/qwen3_omni.py", "30b-a3b", "h100", 1, "fit:" + SEED_80GB),
}
# override sections a shipped plan sets besides its config: the 80 GB plan's talker and Code2Wav on a stream lane
# of their own (graphc/lanes.py; tests/gpu/test_lanes_gpu.py passed on an H100, docs/engine.md)
SECTIONS = {"qwen3_omni_h100_seed80gb_fit": {"lanes": {"speak": True}}}


def compile_shipped(name: str, resources: dict | None = None, sections: dict | None = None) -> Plan:
    """The shipped plan of this name, compiled from its recorded inputs (run from the repo root); `resources`:
    settings laid over its resources' (e.g. {"thinker_kv": {"decode_backend": "fa2"}}); `sections`: override
    sections set besides its own (SECTIONS), e.g. {"lanes": {"speak": False}}."""
    file, preset, gpu, n, ov, *replicas = SHIPPED[name]
    fit = isinstance(ov, str) and ov.startswith("fit:")
    ov = load_config(ov.removeprefix("fit:")) if fit else ov
    if resources:
        ov = {**ov, "resources": {**ov.get("resources", {}), **resources}}
    ov = {**ov, **SECTIONS.get(name, {}), **(sections or {})}
    return compile_model(load_model(file, preset), gpu, n, ov, fit=fit, replicas=replicas[0] if replicas else None).plan


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"plans to compile (default: all): {', '.join(SHIPPED)}")
    ap.add_argument("--out", type=Path, default=ROOT / "plans", help="directory to write NAME.plan into")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in SHIPPED]
    if unknown:
        ap.error(f"no shipped plan named {', '.join(unknown)}; the names are {', '.join(SHIPPED)}")
    os.chdir(ROOT)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or SHIPPED:
        t0 = time.perf_counter()
        plan = compile_shipped(name)
        out = args.out / f"{name}.plan"
        plan.save(out)
        sizes = ", ".join(f"dev{x.index} {x.total_bytes / 2**30:.2f} GiB" for x in plan.devices)
        print(f"{out}: {sizes} ({time.perf_counter() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
