"""`graphc run` refuses a plan whose devices in this host's memory plan more than the host has available,
before a worker starts or a byte is loaded, naming both numbers and the fix (issue 40)."""
from __future__ import annotations

import json
import re

import pytest

from graphc.cli import main
from graphc.errors import InvalidInput
from graphc.hostmem import available_bytes, check_host_memory
from graphc.plan import load_plan
from graphc.units import GiB
from tests.conftest import ROOT, TINY


def test_a_plan_within_what_is_available_passes_and_one_over_it_is_refused_with_the_numbers():
    plan = load_plan(ROOT / "plans" / "tiny_cpu.plan")
    need = plan.replicas * sum(d.total_bytes for d in plan.devices)
    check_host_memory(plan, have=(need, "by hand"))                        # exactly enough
    with pytest.raises(InvalidInput) as e:
        check_host_memory(plan, "plan p", have=(need - 1, "by hand"))
    msg = str(e.value)
    assert f"plan p plans {need:,} B" in msg and f"this host has {need - 1:,} B" in msg
    assert f"--memory-cap {int((need - 1) * 0.9) // 2**20}MiB" in msg and "resources.NAME.pages" in msg


def test_a_gpu_plan_is_checked_by_its_workers_host_lines_summed_over_its_devices():
    plan = load_plan(ROOT / "plans" / "omni_2gpu.plan")
    assert plan.target.host_bytes is None and len(plan.devices) == 2
    need = sum(sum(d.host.values()) for d in plan.devices)        # by hand: every line of both workers
    check_host_memory(plan, have=(need, "by hand"))
    with pytest.raises(InvalidInput) as e:
        check_host_memory(plan, "plan p", have=(need - 1, "by hand"))
    msg = str(e.value)
    assert f"plan p plans {need:,} B" in msg and "for its 2 device(s)" in msg and f"this host has {need - 1:,} B" in msg
    assert "pinned" in msg and "process" in msg and "--ray" in msg and "--memory-cap" not in msg
    one = sum(plan.devices[0].host.values())
    check_host_memory(plan, have=(one, "by hand"), devices=[0])      # a host with device 0's worker alone
    with pytest.raises(InvalidInput):
        check_host_memory(plan, have=(one - 1, "by hand"), devices=[0])


def test_cpu_plans_have_no_host_lines_their_ledgers_are_host_memory():
    plan = load_plan(ROOT / "plans" / "tiny_cpu.plan")
    assert all(not d.host and d.host_total == d.total_bytes for d in plan.devices)


def test_this_host_reports_what_it_has():
    have, source = available_bytes()
    assert 0 < have < 2**50 and ("MemAvailable" in source or "cgroup" in source)


def test_graphc_run_refuses_a_budget_larger_than_the_host_before_a_worker_starts(tmp_path, capsys, monkeypatch):
    have, _ = available_bytes()
    cap = (have * 2) // GiB + 1                                                  # GiB, well past what is free
    out = tmp_path / "p.plan"
    assert main(["plan", TINY, "--preset", "small", "--gpu", "cpu", "--gpus", "2", "--memory-cap", f"{cap}GiB",
                 "-o", str(out), "-q"]) == 0
    plan = load_plan(out)
    need = plan.replicas * sum(d.total_bytes for d in plan.devices)
    assert plan.target.host_bytes == cap * GiB and need > have

    from graphc.runtime import engine

    def no_engine(*a, **k):
        raise AssertionError("the engine started: the refusal must come first")
    monkeypatch.setattr(engine.Engine, "__init__", no_engine)
    reqs = tmp_path / "r.jsonl"
    reqs.write_text(json.dumps({"prompt_token_ids": [1, 2], "max_tokens": 2}) + "\n")
    capsys.readouterr()
    assert main(["run", str(out), "--random-weights", "--requests", str(reqs)]) == 2
    err = capsys.readouterr().err
    assert f"plans {need:,} B" in err and "device(s) in this host's memory" in err
    said = int(re.search(r"this host has ([\d,]+) B", err).group(1).replace(",", ""))
    assert abs(said - have) < have * 0.2 and "--memory-cap" in err
