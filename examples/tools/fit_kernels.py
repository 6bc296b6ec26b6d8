"""Refit the calibrated kernels line (graphc/calibration.yaml: kernels_base_bytes, graph_launch_bytes).

    python examples/tools/fit_kernels.py [docs/data/kernels_fit_2026-12-07.json]

Least squares of measured = base + per_launch x launches over the recorded device boots; prints
both constants and each boot's residual. Add points from new `graphc check --json` runs (the
'kernels' row; launches from the plan's kernels line) to refit after a driver or library change.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def fit(points: list[dict]) -> tuple[float, float]:
    a = torch.tensor([[1.0, p["launches"]] for p in points], dtype=torch.float64)
    y = torch.tensor([[float(p["measured_bytes"])] for p in points], dtype=torch.float64)
    base, per_launch = torch.linalg.lstsq(a, y).solution.flatten().tolist()
    return base, per_launch


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/data/kernels_fit_2026-12-07.json")
    points = json.loads(path.read_text())["points"]
    base, per_launch = fit(points)
    print(f"kernels_base_bytes: {round(base)}\ngraph_launch_bytes: {round(per_launch)}")
    for p in points:
        model = base + per_launch * p["launches"]
        print(f"  {p['device']:45s} measured {p['measured_bytes'] / 2**20:7.0f} MiB  "
              f"fit {model / 2**20:7.0f} MiB  ({(model - p['measured_bytes']) / 2**20:+5.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
