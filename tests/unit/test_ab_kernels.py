"""examples/bench/ab_kernels.py's variants boot the plan they say: every node's knobs with the dropped ones gone
and the added ones at 1, and (unless --capture-all) the booted device's capture order cut to the graphs timed,
in the plan's order, the other device's untouched. The boot itself needs a GPU; here it is stopped at its call."""
import importlib.util
from pathlib import Path

import pytest

from graphc.plan import load_plan

ROOT = Path(__file__).resolve().parents[2]
PLAN = str(ROOT / "plans" / "omni_2gpu.plan")


class Booted(Exception):
    pass


def _booted(monkeypatch, capture_all: bool, graphs: list[str]):
    spec = importlib.util.spec_from_file_location("ab_kernels", ROOT / "examples" / "bench" / "ab_kernels.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    seen = {}

    def boot(plan, devices, emulate):
        seen.update(plan=plan, devices=devices, emulate=emulate)
        raise Booted
    monkeypatch.setattr(ab, "boot_plan", boot)
    with pytest.raises(Booted):
        ab.time_variant(PLAN, 1, {"moe_sm90_from"}, {"pdl": 1}, graphs, False, 1, 1, capture_all)
    return seen


@pytest.mark.parametrize("capture_all", [False, True])
def test_a_variant_boots_its_knobs_and_the_graphs_it_times(monkeypatch, capture_all):
    want = load_plan(PLAN)
    order = want.devices[1].capture_order
    graphs = [order[-1], order[0], "not/a:graph/1"]
    seen = _booted(monkeypatch, capture_all, graphs)
    plan = seen["plan"]
    assert seen["devices"] == [1] and seen["emulate"]
    assert plan.devices[1].capture_order == (order if capture_all else [order[0], order[-1]])
    assert plan.devices[0].capture_order == want.devices[0].capture_order
    for name, node in plan.nodes.items():
        before = dict(want.nodes[name].kernels)
        before.pop("moe_sm90_from", None)
        assert node.kernels == before | {"pdl": 1}, name
    assert any("moe_sm90_from" in n.kernels for n in want.nodes.values())


def test_a_knob_setting_reads_its_value_and_refuses_what_is_not_one():
    """--with KNOB[=N] (ab_kernels, bench_speech): KNOB alone is 1, KNOB=N is N; an unknown knob and a value that
    is not a whole number are refused, naming them."""
    import argparse
    import sys
    sys.path.insert(0, str(ROOT / "examples" / "bench"))
    from bench_steps import knob_setting

    assert knob_setting("pdl") == ("pdl", 1)
    assert knob_setting("gemm_rows=16") == ("gemm_rows", 16)
    assert knob_setting("gemm_rows=0") == ("gemm_rows", 0)
    for bad, words in (("gemm_row=16", "'gemm_row' is not a kernel knob"), ("gemm_rows=", "whole number"),
                       ("gemm_rows=-1", "whole number"), ("gemm_rows=1.5", "whole number")):
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            knob_setting(bad)
