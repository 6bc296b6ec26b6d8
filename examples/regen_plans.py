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

from graphc.pipeline import compile_model, load_model  # noqa: E402

SHIPPED = {
    # name: (model file, preset, gpu, devices, overrides)
    "tiny_cpu": ("models/tiny_omni.py", "tiny", "cpu", 1, {}),
    "tiny_h100": ("models/tiny_omni.py", "tiny", "h100", 1, {}),
    "tiny_small_2xh100": ("models/tiny_omni.py", "small", "h100", 2, {}),
}


def main(names: list[str]) -> None:
    os.chdir(ROOT)
    for name in names or SHIPPED:
        file, preset, gpu, n, ov = SHIPPED[name]
        plan = compile_model(load_model(file, preset), gpu, n, ov).plan
        out = ROOT / "plans" / f"{name}.plan"
        plan.save(out)
        d = plan.devices
        print(f"{out.relative_to(ROOT)}: " + ", ".join(f"dev{x.index} {x.total_bytes / 2**30:.2f} GiB" for x in d))


if __name__ == "__main__":
    main(sys.argv[1:])
