"""Boot the tiny h100 plan on this GPU, capped to an h100, and hold it to its ledger: every planned
graph captured and replayed, measured peak within the check's tolerance and under the card.
Skipped without CUDA (tests/conftest.py); needs flashinfer-python. Full-size plans are booted by
examples/tools/boot_plans.py (docs/gpu-boot.md)."""
from __future__ import annotations

import gc

import pytest
import torch

from graphc.plan import load_plan
from graphc.runtime.boot import boot_plan
from graphc.runtime.check import compare

pytestmark = pytest.mark.gpu


def test_tiny_plan_boots_within_its_ledger():
    pytest.importorskip("flashinfer")
    # the boot measures the device as graphc check's own process finds it: give back what earlier tests in this
    # process left cached, and forget their peak (run after the vision tests, their 15 GB counted as the boot's)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.memory_allocated() < 2**30, "an earlier test keeps GPU tensors alive"
    plan = load_plan("plans/tiny_h100.plan")
    (boot,) = boot_plan(plan, emulate=True)          # kernels prebuilt in parallel first
    check = compare(boot)
    assert not check.missing_graphs
    assert sorted(boot.graphs) == sorted(plan.devices[0].capture_order)
    assert all(k in boot.ran for k in boot.graphs)              # each replayed, finite
    assert check.ok, (check.measured_total, check.planned_total)
    assert abs(check.measured_total - check.planned_total) <= 0.05 * check.planned_total
