"""Host memory a plan's devices take on this host (a cpu target's devices live in it, a GPU target's workers
hold page-locked buffers, the weight loader's chunk and themselves there): what this host has available now,
and the check `graphc run` and graphc.Engine make before a worker starts or a byte is loaded. Core: no torch."""
from __future__ import annotations

from pathlib import Path

from graphc.errors import InvalidInput
from graphc.units import MiB, fmt_bytes

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")
CAP_SHARE = 0.9            # the cap a refusal suggests: this share of what is available, the rest for the processes
STAGING_BYTES = 64 << 20   # the most of one tensor the weight loader holds on the host at once (a row at least):
                           # graphc/runtime/checkpoint.py reads by it, graphc/passes/size_host.py plans it
def available_bytes() -> tuple[int, str] | None:
    """(bytes, where from): the least of the kernel's MemAvailable and what this process's cgroup (v2) may
    still charge; None where neither can be read (not Linux)."""
    found = []
    meminfo = _meminfo_available()
    if meminfo is not None:
        found.append((meminfo, "MemAvailable in /proc/meminfo"))
    cgroup = _cgroup_room()
    if cgroup is not None:
        found.append((cgroup, "the cgroup's memory.max less its memory.current"))
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cgroup_room() -> int | None:
    """memory.max - memory.current of this process's cgroup (v2), or None where it has no limit."""
    try:
        rel = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.startswith("0::"))
        d = CGROUP / rel.lstrip("/")
        limit = (d / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((d / "memory.current").read_text())
    except (OSError, StopIteration, ValueError):
        return None


def check_host_memory(plan, where: str = "the plan", have: tuple[int, str] | None = None,
                      devices: list[int] | None = None) -> None:
    """Refuse a plan whose devices on this host together plan more of its memory than it has available now,
    naming both numbers and the fix: a cpu plan's devices live in it (their ledgers), a GPU plan's workers
    hold their host lines (pinned, staging, process: graphc/passes/size_host.py). Plans with neither (GPU
    plans from before the host lines) and hosts that report nothing pass. devices: the plan devices that live
    on this host (default: all of them)."""
    if plan.target.host_bytes is None and not any(d.host for d in plan.devices):
        return
    have = have if have is not None else available_bytes()
    if have is None:
        return
    mine = [d for d in plan.devices if devices is None or d.index in devices]
    mine = mine * (plan.replicas * plan.tensor_parallel if devices is None else 1)    # every replica and rank
    need = sum(d.host_total for d in mine)
    free, source = have
    if need <= free:
        return
    said = (f"{where} plans {need:,} B ({fmt_bytes(need)}) for its {len(mine)} device(s) in this host's memory; "
            f"this host has {free:,} B ({fmt_bytes(free)}) available ({source})")
    if plan.target.host_bytes is None:
        lines = ", ".join(f"{k} {fmt_bytes(sum(d.host.get(k, 0) for d in mine))}" for k in mine[0].host)
        raise InvalidInput(said, f"each GPU device's worker holds host memory of its own ({lines}); the kernel "
                           "would kill a worker", "free host memory (other processes), or spread the plan's "
                           "devices over several hosts (graphc run --ray ADDRESS), or re-plan with fewer replicas "
                           "(--replicas) or smaller walk budgets (fewer captured launches hold less)")
    cap = max(int(free * CAP_SHARE) // MiB, 1)
    raise InvalidInput(
        said,
        f"the plan's host budget is {plan.target.host_bytes:,} B ({fmt_bytes(plan.target.host_bytes)}); its "
        "devices would fill more memory than exists, and the kernel would kill a worker",
        f"re-plan with --memory-cap {cap}MiB ({CAP_SHARE:.0%} of what is available, the rest for the processes "
        f"themselves) or with fewer KV pages (--set resources.NAME.pages=N, NAME a paged KV resource of the model)")
