"""check_target against a card smaller than the plan's by a few MiB: the refusal names both totals in bytes
and the shortfall (two totals equal at 0.01 GiB can differ by MiB), and a plan for the exact card boots.
The card is faked: torch reports no CUDA device on CPU."""
import pytest
import torch

from graphc.errors import InvalidInput
from graphc.plan import load_plan
from graphc.runtime import boot

H100_TOTAL = 85_017_493_504          # torch's total_memory on an H100 SXM 80GB HBM3 (measured, driver 580.159.04)


def fake_card(monkeypatch, total: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(boot, "local_gpu", lambda: ("h100", "sm_90", total))


def test_a_card_short_by_bytes_is_refused_with_the_shortfall(monkeypatch):
    plan = load_plan("plans/tiny_h100.plan")
    fake_card(monkeypatch, plan.target.capacity_bytes - 2_000_000)
    with pytest.raises(InvalidInput) as e:
        boot.check_target(plan, emulate=False, force=False)
    msg = str(e.value)
    assert "2,000,000 B short" in msg and f"{plan.target.capacity_bytes:,} B" in msg, msg
    assert "--memory-cap" in msg, msg


def test_the_shipped_h100_plan_fits_the_measured_card(monkeypatch):
    fake_card(monkeypatch, H100_TOTAL)
    assert boot.check_target(load_plan("plans/tiny_h100.plan"), emulate=False, force=False) == torch.device("cuda", 0)
