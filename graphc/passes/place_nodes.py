"""Place nodes on N devices and size the KV pools.

Pins are honoured and nodes that share a KV pool stay together. Every other assignment is scored
(exhaustively up to MAX_CANDIDATES, device labels deduplicated): a feasible one must hold its
fixed pools and, in each fill pool, the pages of the longest allowed request; among those the one
whose worst fill pool holds the most longest-requests wins, then fewer cross-device edges. Fill
pools take what their device has left (split by fill_share); fixed pools take their page count.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from graphc.errors import InvalidInput
from graphc.passes.tally_ledger import DeviceLedger, Sizing, device_resources, overhead_bytes, persistent_allocs, \
    tally_ledger
from resources.paged_kv import PagedKVSpec

MAX_CANDIDATES = 20000


@dataclass(frozen=True)
class Placement:
    assignment: dict[str, int]
    devices: list[DeviceLedger]
    why: str

    def check(self, s: Sizing) -> None:
        assert set(self.assignment) == {n.name for n in s.ir.model.nodes}
        for d in self.devices:
            assert d.total == sum(i.bytes for i in d.items)


def _kv_groups(s: Sizing) -> list[set[str]]:
    """Nodes that must share a device because they share a KV pool."""
    groups: list[set[str]] = []
    for res, users in s.ir.users.items():
        if isinstance(s.ir.model.resource(res), PagedKVSpec) and len(users) > 1:
            groups.append({n for n, _ in users})
    return groups


def _candidates(s: Sizing):
    nodes = [n.name for n in s.ir.model.nodes]
    n_dev = s.ir.num_devices
    pinned = {n.name: n.device for n in s.ir.model.nodes if n.device is not None}
    groups = _kv_groups(s)
    free = [n for n in nodes if n not in pinned]
    symmetric = not pinned
    for combo in itertools.product(range(n_dev), repeat=len(free)):
        if symmetric and any(d > max(combo[:i], default=-1) + 1 for i, d in enumerate(combo)):
            continue   # the same split with device labels permuted
        a = dict(pinned)
        a.update(zip(free, combo))
        if all(len({a[n] for n in g}) == 1 for g in groups):
            yield a


def _fixed_pages(s: Sizing, nodes: list[str]) -> dict[str, int]:
    return {r: s.ir.model.resource(r).pages for r in device_resources(s, nodes)
            if isinstance(s.ir.model.resource(r), PagedKVSpec) and s.ir.model.resource(r).pages}


def _fixed_cost(s: Sizing, nodes: list[str]) -> int:
    """A quick estimate of everything but fill pools: the persistent allocations, the largest
    capture and eager peaks, and the calibrated overheads (the ledger makes it exact)."""
    total = sum(size for _, _, size, _ in persistent_allocs(s, nodes, _fixed_pages(s, nodes)))
    total += max((t.peak_bytes for k, (_, t) in s.acts.graphs.items() if k[0] in nodes), default=0)
    total += max((t.peak_bytes for k, t in s.acts.eager.items() if k[0] in nodes), default=0)
    return total + overhead_bytes(s, nodes)


def _fill_pools(s: Sizing, nodes: list[str]) -> list[PagedKVSpec]:
    return [s.ir.model.resource(r) for r in device_resources(s, nodes)
            if isinstance(s.ir.model.resource(r), PagedKVSpec) and s.ir.model.resource(r).pages is None]


def describe(s: Sizing, a: dict[str, int]) -> str:
    """'{a, b} | {c}: thinker_kv holds 6.6 longest requests' -- what the score compares."""
    groups = " | ".join("{" + ", ".join(n for n in a if a[n] == d) + "}" for d in range(s.ir.num_devices))
    feasible, overflow, worst, cross, _ = _score(s, a)
    if not feasible:
        return f"{groups}: does not fit ({overflow / 2**30:.2f} GiB short)"
    pool = _worst_pool(s, a)
    return f"{groups}: {pool} holds {worst:.1f} longest requests" if pool else f"{groups}: no fill pool"


def _worst_pool(s: Sizing, a: dict[str, int]) -> str | None:
    cap, worst, name = s.ir.target.memory_bytes, float("inf"), None
    for d in range(s.ir.num_devices):
        nodes = [n for n in a if a[n] == d]
        pools = _fill_pools(s, nodes)
        left = cap - _fixed_cost(s, nodes)
        shares = sum(p.fill_share for p in pools)
        for p in pools:
            ratio = left * p.fill_share / shares / p.page_bytes / p.min_pages
            if ratio < worst:
                worst, name = ratio, p.name
    return name


def _score(s: Sizing, a: dict[str, int]) -> tuple:
    cap = s.ir.target.memory_bytes
    feasible, worst, overflow = True, float("inf"), 0
    for d in range(s.ir.num_devices):
        nodes = [n for n in a if a[n] == d]
        pools = _fill_pools(s, nodes)
        left = cap - _fixed_cost(s, nodes)
        need = sum(p.min_pages * p.page_bytes for p in pools)
        if left < need:
            feasible, overflow = False, overflow + need - left
        shares = sum(p.fill_share for p in pools)
        for p in pools:
            pages = left * p.fill_share / shares / p.page_bytes
            worst = min(worst, pages / p.min_pages)
    cross = sum(1 for e in s.ir.model.edges if a[e.ends()[0][0]] != a[e.ends()[1][0]])
    used = len(set(a.values()))
    return (feasible, -overflow, worst if worst != float("inf") else 0, -cross, used)


def fill_pages(s: Sizing, index: int, nodes: list[str]) -> DeviceLedger:
    """The device's ledger with its fill pools as large as fits (binary search on the bytes they
    share, since allocator rounding makes the total a step function of the page count)."""
    pools = _fill_pools(s, nodes)
    fixed = _fixed_pages(s, nodes)
    shares = sum(p.fill_share for p in pools)

    def ledger_with(budget: int) -> DeviceLedger:
        pages = dict(fixed, **{p.name: max(0, int(budget * p.fill_share / shares) // p.page_bytes) for p in pools})
        return tally_ledger(s, index, nodes, pages)

    empty = ledger_with(0)
    if not pools or empty.free <= 0:
        return empty
    lo, hi = 0, empty.free + 1          # ledger_with(lo) fits; ledger_with(hi) does not
    while hi - lo > min(p.page_bytes for p in pools):
        mid = (lo + hi) // 2
        if ledger_with(mid).free >= 0:
            lo = mid
        else:
            hi = mid
    return ledger_with(lo)


def place_nodes(s: Sizing) -> Placement:
    cands = list(itertools.islice(_candidates(s), MAX_CANDIDATES))
    if not cands:
        raise InvalidInput("no placement honours the pins and keeps each KV pool's users together",
                           f"pins: { {n.name: n.device for n in s.ir.model.nodes if n.device is not None} }",
                           "pin the users of one KV pool to the same device")
    ranked = sorted(cands, key=lambda a: _score(s, a), reverse=True)
    best = None
    for a in ranked[:8]:
        devices = [fill_pages(s, d, [n for n in a if a[n] == d]) for d in range(s.ir.num_devices)]
        if best is None:
            best = (a, devices)
        if all(dv.free >= 0 for dv in devices):
            best = (a, devices)
            break
    a, devices = best
    if s.ir.num_devices > 1:
        runner = next((c for c in ranked if c != a), None)
        why = (f"{len(cands)} placements scored by the most longest-allowed requests the worst fill KV pool holds"
               f" (estimated), then fewest cross-device edges; chosen {describe(s, a)}"
               + (f"; next best {describe(s, runner)}" if runner else ""))
    else:
        why = "one device"
    out = Placement(a, devices, why)
    out.check(s)
    return out
