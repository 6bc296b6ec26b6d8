"""Every plan in plans/ is regenerated from its recorded inputs and compared."""
from pathlib import Path

import pytest

from graphc.pipeline import compile_model
from graphc.source import load_model
from graphc.plan import load_plan

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted((ROOT / "plans").glob("*.plan"))
# the torch/python that compiled it (not a planning decision), and the record of what --fit trimmed
# (its changes are in the plan's overrides, from which it is regenerated here)
IGNORED = {"versions", "trimmed"}


@pytest.mark.parametrize("path", PLANS, ids=[p.name for p in PLANS])
def test_shipped_plan_is_current(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    shipped = load_plan(path)
    src = load_model(shipped.model.file, shipped.model.preset)
    assert src.record()["sha256"] == shipped.model.sha256, f"{shipped.model.file} changed: regenerate {path.name}"
    fresh = compile_model(src, shipped.target.gpu, shipped.target.count, shipped.overrides).plan
    a = {k: v for k, v in shipped.body().items() if k not in IGNORED}
    b = {k: v for k, v in fresh.body().items() if k not in IGNORED}
    assert a == b, f"{path.name} is stale: run python examples/tools/regen_plans.py"


def test_plans_exist():
    assert PLANS, "plans/ holds no shipped plans"
