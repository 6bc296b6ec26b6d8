"""check_fit's refusals, against the oracle model (tests/oracle_model.py) planned for the cpu.

On the cpu nothing is captured and there is no allocator, so every ledger line is known by hand:
    weights.mlp   the arena: up [F, 64] + down [512, F] bf16, scale 100 bf16 -> 256 B, offsets 3 fp32 -> 256 B
    kv.cache      pages x 8192 B (2 (K, V) x 2 layers x 16 tokens x 1 kv head x 64 dims x 2 B)
    workspace.ws  the declared 16 MiB x 2 slots
    activations   the largest eager step: mixed at 32 tokens, h + g = 4 x 32 x F B = 128 MiB
    headroom      0 on the cpu
With a fixed pool of 32 pages (512 tokens; the longest request, 1,024 tokens, needs 64) and a 1 GiB
memory cap, the device is over capacity (the weights alone are 1.13 GiB) and the pool is short.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from graphc.errors import DoesNotFit
from graphc.pipeline import compile_model
from graphc.source import load_model
from graphc.units import GiB, KiB, MiB, fmt_bytes
from tests import oracle_model as om

MODEL = str(Path(__file__).resolve().parents[1] / "oracle_model.py")
F = om.FFN
ARENA = 64 * F * 2 + F * 512 * 2 + 256 + 256
PAGE_BYTES = 2 * om.LAYERS * om.PAGE_SIZE * 1 * om.HEAD_DIM * 2      # 8192
CAP = 1 * GiB
SHORT = {"resources": {"cache": {"pages": 32}}}
# every ledger line of the device with 32 pages, by hand, largest first
LINES = [("weights.mlp", ARENA), ("activations", 4 * 32 * F), ("workspace.ws", 2 * om.WORKSPACE_BYTES),
         ("kv.cache", 32 * PAGE_BYTES), ("headroom", 0)]
TOTAL = sum(n for _, n in LINES)


@pytest.fixture(scope="module")
def refused():
    with pytest.raises(DoesNotFit) as e:
        compile_model(load_model(MODEL), "cpu", 1, SHORT, memory_cap=CAP)
    return e.value


def test_hand_ledger_is_the_plans(refused):
    """The premise of the texts below: the device's lines are the ones computed by hand."""
    (dev,) = refused.result.placement.devices
    assert {i.component: i.bytes for i in dev.items} == dict(LINES)
    assert 32 * PAGE_BYTES == 256 * KiB and 4 * 32 * F == 128 * MiB


def test_device_over_capacity_names_its_four_largest_lines(refused):
    over = TOTAL - CAP                                   # 288.25 MiB
    problems = [p for p in refused.result.fit.problems if p.text.startswith("device")]
    assert len(problems) == 1
    p = problems[0]
    want = (f"device 0 needs {fmt_bytes(TOTAL)} of {fmt_bytes(CAP)} ({fmt_bytes(over)} over): "
            f"weights.mlp {fmt_bytes(ARENA)}, activations 128.00 MiB, workspace.ws 32.00 MiB, kv.cache 256.00 KiB, ...")
    assert p.text == want, (
        "the four largest lines in decreasing size, then '...': the fifth, headroom (0 B), is left out")
    assert p.device == 0
    assert p.over_bytes == over == 302_252_544, "over_bytes: the bytes past capacity, a positive number"


def test_kv_pool_short_of_the_longest_request(refused):
    kv = [p for p in refused.result.fit.problems if p.text.startswith("KV pool")]
    assert [(p.device, p.text) for p in kv] == [
        (0, "KV pool 'cache' on device 0 holds 32 pages (512 tokens); the longest allowed request (1,024 tokens) "
            "needs 64 pages of 16")]
    assert kv[0].over_bytes == 0, "a pool that is too small is not bytes over capacity"
    assert len(refused.result.fit.problems) == 2 and not refused.result.fit.fits


def test_a_change_that_cures_the_short_pool_is_offered_though_the_device_stays_over(refused):
    """suggest_remedies reads over_bytes == 0 as 'a KV pool is short': a re-plan with fewer short pools
    helps even when it frees nothing. Growing the pool to 64 pages (+256 KiB) or allowing requests of
    512 tokens (what 32 pages hold) both leave the device over capacity, and both must be offered."""
    by_change = {r.change: r for r in refused.remedies}
    grow, shorter = by_change.get("resources.cache.pages=64"), by_change.get("resources.cache.max_seq_len=512")
    assert grow is not None and shorter is not None, sorted(by_change)
    assert (grow.fits, grow.freed) == (False, -32 * PAGE_BYTES)      # 32 more pages of 8 KiB
    assert (shorter.fits, shorter.freed) == (False, 0)


def test_a_short_pool_alone_is_one_problem_with_no_bytes_over():
    with pytest.raises(DoesNotFit) as e:
        compile_model(load_model(MODEL), "cpu", 1, SHORT, remedies=False)      # 8 GiB: the device fits
    assert [(p.device, p.over_bytes, p.text.split(";")[0]) for p in e.value.result.fit.problems] == [
        (0, 0, "KV pool 'cache' on device 0 holds 32 pages (512 tokens)")]


def test_a_plan_that_fits_has_no_problems():
    fit = compile_model(load_model(MODEL), "cpu", 1, {"resources": {"cache": {"pages": 64}}}).result.fit
    assert fit.problems == [] and fit.fits
