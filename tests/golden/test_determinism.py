"""A plan is a pure function of its inputs. Every shipped plan, compiled again from its recorded
inputs (examples/tools/regen_plans.py: model, preset, target, config, --fit) in a fresh process under
another PYTHONHASHSEED, on one core or all, and in one process after the other models, is
byte-identical to the file in plans/ (the versions stamp aside). The --fit plan is re-trimmed by
the search here, not loaded from its overrides, so its `trimmed` list is reproduced too."""
from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphc.plan import Plan, fingerprint, load_plan

ROOT = Path(__file__).resolve().parents[2]
REGEN = ROOT / "examples" / "tools" / "regen_plans.py"
SHIPPED = sorted(p.stem for p in (ROOT / "plans").glob("*.plan"))


def _compile(names: list[str], out: Path, hashseed: int, one_core: bool) -> subprocess.Popen:
    env = dict(os.environ, PYTHONHASHSEED=str(hashseed), OMP_NUM_THREADS="1" if one_core else "2",
               GRAPHC_CACHE_DIR="off")         # every trace computed in each process, none read from disk
    pin = (lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})) if one_core else None
    return subprocess.Popen([sys.executable, str(REGEN), "--out", str(out), *names], cwd=ROOT, env=env,
                            preexec_fn=pin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, what: str) -> None:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"{what} failed:\n{out[-3000:]}"


def _as_shipped(fresh: Path, shipped: Path) -> str:
    """The fresh plan's YAML with the shipped plan's versions stamp (the only field allowed to differ)."""
    data = load_plan(fresh).dump()
    data["versions"] = load_plan(shipped).versions
    data["fingerprint"] = fingerprint({k: v for k, v in data.items() if k != "fingerprint"})
    return Plan.model_validate(data).to_yaml()


def _assert_identical(out: Path, names: list[str], how: str) -> None:
    for name in names:
        shipped = ROOT / "plans" / f"{name}.plan"
        text, want = _as_shipped(out / f"{name}.plan", shipped), shipped.read_text()
        if text != want:
            diff = "".join(list(difflib.unified_diff(want.splitlines(True), text.splitlines(True), "plans/" + name,
                                                     how, n=1))[:40])
            pytest.fail(f"{name} compiled {how} differs from plans/{name}.plan:\n{diff}\n"
                        "a plan must not depend on hash seeds, cores or what ran before; if the inputs "
                        "changed on purpose, run python examples/tools/regen_plans.py")


def test_shipped_plans_exist():
    assert len(SHIPPED) >= 8, "plans/ lost shipped plans"


def test_each_shipped_plan_compiled_alone_in_a_fresh_process(tmp_path):
    """One process per plan, two at a time, each under its own hash seed; every other one on one core."""
    procs = []
    for i, name in enumerate(SHIPPED):
        procs.append((name, _compile([name], tmp_path, hashseed=1000 + 7 * i, one_core=i % 2 == 1)))
        if len(procs) == 2 or i == len(SHIPPED) - 1:
            for n, p in procs:
                _finish(p, f"compiling {n}")
            procs = []
    _assert_identical(tmp_path, SHIPPED, "alone in a fresh process")


def test_shipped_plans_compiled_after_each_other_in_one_process(tmp_path):
    """In reverse name order, so most plans are made with the memo tables of other models already full."""
    order = SHIPPED[::-1]
    _finish(_compile(order, tmp_path, hashseed=4242, one_core=False), "compiling all plans in one process")
    _assert_identical(tmp_path, order, "in one process after the other plans")
