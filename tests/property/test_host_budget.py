"""Devices in one host's memory share its budget (issue 40): for any number of cpu devices and any host
budget, the planned bytes of all devices sum to at most that budget, each device's capacity is the
budget's even share, and the plan records the budget; whether the devices hold one copy of the model or a
replica each (chosen, or forced by --replicas). tiny_omni's `small` preset fills its KV pool to
what a device has left, so a plan's devices hold about their whole share."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from graphc.errors import DoesNotFit
from graphc.pipeline import compile_model
from graphc.source import load_model
from graphc.targets import get_target
from graphc.units import GiB, MiB
from tests.conftest import TINY

SMALL = load_model(TINY, "small")


@settings(max_examples=25, deadline=None)
@given(devices=st.integers(1, 6), budget=st.integers(64 * MiB, 64 * GiB), layout=st.sampled_from(["auto", "one", "each"]))
def test_the_devices_of_one_host_plan_within_its_budget(devices, budget, layout):
    replicas = {"auto": None, "one": 1, "each": devices}[layout]
    try:
        plan = compile_model(SMALL, "cpu", devices, memory_cap=budget, remedies=False, replicas=replicas).plan
    except DoesNotFit as e:           # a share too small for a node: refused, each device offered its share
        assert all(d.capacity == budget // devices for d in e.result.placement.devices)
        return
    assert plan.target.host_bytes == budget and plan.target.count == devices
    assert replicas is None or plan.replicas == replicas
    assert plan.replicas * len(plan.devices) == devices
    assert all(d.capacity_bytes == budget // devices for d in plan.devices)
    assert plan.replicas * sum(d.total_bytes for d in plan.devices) <= budget
    assert f"{budget:,} B // {devices} = {budget // devices:,} B each" in plan.target.memory_source


def test_the_default_host_budget_is_split_too():
    for n in (1, 2, 3):
        t = get_target("cpu", devices=n)
        assert t.host_bytes == 8 * GiB and t.memory_bytes == 8 * GiB // n
    assert get_target("h100", devices=2).memory_bytes == get_target("h100").memory_bytes    # cards are not shared
