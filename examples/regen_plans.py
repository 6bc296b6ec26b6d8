"""Regenerate the shipped plans in plans/ (tests/golden compares them against fresh compiles).

    python examples/regen_plans.py            # all
    python examples/regen_plans.py tiny_cpu   # one, by name
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphc.overrides import load_config  # noqa: E402
from graphc.pipeline import compile_model, load_model  # noqa: E402

SEED_80GB = str(ROOT / "examples" / "configs" / "seed_80gb.yaml")

SHIPPED = {
    # name: (model file, preset, gpu, devices, overrides)
    "tiny_cpu": ("models/tiny_omni.py", "tiny", "cpu", 1, {}),
    "tiny_h100": ("models/tiny_omni.py", "tiny", "h100", 1, {}),
    "tiny_small_2xh100": ("models/tiny_omni.py", "small", "h100", 2, {}),
    "qwen3_omni_tiny_cpu": ("models/qwen3_omni.py", "tiny", "cpu", 1, {}),
    "qwen3_omni_2xh100": ("models/qwen3_omni.py", "30b-a3b", "h100", 2, {}),
    "qwen3_omni_h200": ("models/qwen3_omni.py", "30b-a3b", "h200", 1, {}),
    "qwen3_asr_1.7b_h100": ("models/qwen3_asr.py", "1.7b", "h100", 1, {}),
    # the seeds' 80 GB settings, trimmed by --fit until they fit one h100 (the trims are in the plan)
    "qwen3_omni_h100_seed80gb_fit": ("models/qwen3_omni.py", "30b-a3b", "h100", 1, "fit:" + SEED_80GB),
}


def main(names: list[str]) -> None:
    os.chdir(ROOT)
    for name in names or SHIPPED:
        file, preset, gpu, n, ov = SHIPPED[name]
        fit = isinstance(ov, str) and ov.startswith("fit:")
        ov = load_config(ov.removeprefix("fit:")) if fit else ov
        plan = compile_model(load_model(file, preset), gpu, n, ov, fit=fit).plan
        out = ROOT / "plans" / f"{name}.plan"
        plan.save(out)
        d = plan.devices
        print(f"{out.relative_to(ROOT)}: " + ", ".join(f"dev{x.index} {x.total_bytes / 2**30:.2f} GiB" for x in d))


if __name__ == "__main__":
    main(sys.argv[1:])
