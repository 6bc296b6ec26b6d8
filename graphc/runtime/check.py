"""Planned against measured, per device and ledger component; the verdict `graphc check` exits with."""
from __future__ import annotations

from dataclasses import dataclass, field

from graphc.runtime.boot import DeviceBoot

TOLERANCE = 0.02   # measured peak may exceed planned by at most 2% (issue 5's bar)
EXACT = ("weights.", "kv.", "state.", "workspace.", "media_cache.")   # sized exactly: a CPU boot measures them exactly
CPU_SCOPE = ("verifies shapes, finiteness and the real storages of weights, KV, workspaces and media caches; activations "
             "measured on CPU kernels (informational); device memory, allocator, capture pool not measured on CPU")


@dataclass(frozen=True)
class Row:
    component: str
    planned: int
    measured: int | None     # None: not measured on this device kind (e.g. headroom, a CPU's context)

    @property
    def diff(self) -> int | None:
        return None if self.measured is None else self.measured - self.planned


@dataclass(frozen=True)
class DeviceCheck:
    index: int
    rows: list[Row]
    planned_total: int
    measured_total: int | None
    graphs_planned: list[str]
    graphs_captured: list[str]
    steps_run: list[str]
    tolerance: float
    notes: list[str]
    capacity: int            # the plan's card: a peak above it would not have booted there
    comm_join: int | None = None   # of the comm line, what joining the process group alone added

    @property
    def missing_graphs(self) -> list[str]:
        return [g for g in self.graphs_planned if g not in self.graphs_captured]

    @property
    def over(self) -> bool:
        return self.measured_total is not None and self.measured_total > self.planned_total * (1 + self.tolerance)

    @property
    def over_card(self) -> bool:
        # under --emulate torch is capped, but memory outside it (graph executables) is not
        return self.measured_total is not None and self.measured_total > self.capacity

    @property
    def ok(self) -> bool:
        return not self.missing_graphs and not self.over and not self.over_card


@dataclass(frozen=True)
class CpuCheck(DeviceCheck):
    """A CPU boot has no device memory to measure: its verdict is the exact components' real storages
    (every byte, no tolerance) and the arena layout; activations are shown, not judged."""

    faults: list[str] = field(default_factory=list)
    activations: int = 0          # the largest step's peak live op-output bytes on the CPU kernels
    activations_step: str = ""
    scope: str = CPU_SCOPE

    @property
    def ok(self) -> bool:
        return super().ok and not self.faults

    @property
    def planned_activations(self) -> int:
        return next((r.planned for r in self.rows if r.component == "activations"), 0)


def compare(boot: DeviceBoot, tolerance: float = TOLERANCE) -> DeviceCheck:
    dev = boot.plan.devices[boot.index]
    rows = [Row(c, b, boot.measured.get(c)) for c, b in dev.ledger.items()]
    rows += [Row(c, 0, b) for c, b in boot.measured.items() if c not in dev.ledger and not c.startswith("_")]
    planned = dev.total_bytes - dev.ledger.get("headroom", 0)
    # the device's peak (warm-up included) where the GPU boot measured one, else its end state
    measured = boot.measured.get("_peak_device", boot.measured.get("_device_used"))
    args = (boot.index, rows, planned, measured, list(dev.capture_order), list(boot.graphs), list(boot.ran),
            tolerance, list(boot.notes), boot.plan.target.capacity_bytes, boot.measured.get("_comm_join"))
    if boot.device.type != "cpu":
        return DeviceCheck(*args)
    faults = list(boot.faults) + [
        f"{r.component}: its storages hold {r.measured or 0:,} B, the plan says {r.planned:,} B "
        f"({(r.measured or 0) - r.planned:+,} B)"
        for r in rows if r.component.startswith(EXACT) and r.measured != r.planned]
    step = max(boot.step_peaks, key=boot.step_peaks.get, default="")
    return CpuCheck(*args, faults=faults, activations=boot.step_peaks.get(step, 0), activations_step=step)


def verdict(check: DeviceCheck) -> dict:
    """A device's check as plain numbers (a worker's boot summary, the run's stats): planned and measured
    peak bytes, their difference as a fraction of planned, the graphs planned and captured, the verdict,
    and each ledger line's [planned, measured] bytes."""
    within = None if check.measured_total is None else check.measured_total / check.planned_total - 1
    return {"planned": check.planned_total, "measured": check.measured_total, "within": within,
            "graphs_planned": len(check.graphs_planned), "graphs_captured": len(check.graphs_captured),
            "missing_graphs": check.missing_graphs, "ok": check.ok,
            "lines": {r.component: [r.planned, r.measured] for r in check.rows}, "comm_join": check.comm_join}
