"""Place nodes on N devices and size the KV pools.

Pins are honoured and nodes that share a KV pool stay together. Every other assignment is scored
(exhaustively up to MAX_CANDIDATES, device labels deduplicated): a feasible one must hold its
fixed pools and, in each fill pool, the pages of the longest allowed request; among those the one
whose worst fill pool holds the most longest-requests wins, then fewer bytes crossing devices (the
receive buffers of the edges cut: what a step at its budget sends device to device). Fill
pools take what their device has left (split by fill_share); fixed pools take their page count.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from graphc.allocator import LARGE_BUFFER, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_SIZE
from graphc.declare import DTYPE_BYTES
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
    """'{a, b} | {c}: llm_kv holds 6.6 longest requests' -- what the score compares."""
    groups = " | ".join("{" + ", ".join(n for n in a if a[n] == d) + "}" for d in range(s.ir.num_devices))
    feasible, neg_overflow, worst, cross, _ = _score(s, a)
    if not feasible:
        return f"{groups}: does not fit ({-neg_overflow / 2**30:.2f} GiB short)"
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
    cross = crossing_bytes(s, a)
    used = len(set(a.values()))
    return (feasible, -overflow, worst if worst != float("inf") else 0, -cross, used)


def crossing_bytes(s: Sizing, a: dict[str, int]) -> int:
    """Bytes a placement sends device to device at its steps' budgets: every receive buffer it needs."""
    return sum(n * DTYPE_BYTES[dt] for d in range(s.ir.num_devices)
               for _, _, n, dt in s.ir.transfers_into([x for x in a if a[x] == d]))


# How far past the device's free bytes a fill pool may still fit: its segment's unused tail can take
# allocations that would otherwise have opened a segment of their own (at most one 20 MiB segment)
FILL_WINDOW = LARGE_BUFFER + ROUND_LARGE


def fill_pages(s: Sizing, index: int, nodes: list[str]) -> DeviceLedger:
    """The device's ledger with its fill pools as large as fits.

    The total is not monotone in the pools' size: allocator rounding makes it a step function, and
    a pool's segment tail can take later allocations, so a bigger pool can cost less (one of 1-10 MiB
    gets a 20 MiB segment, one over 1 MiB leaves the small pool). It is monotone inside each
    allocator size band of every pool, and only FILL_WINDOW either side of the free bytes is in
    doubt: the highest band start that fits, searched down from the top, holds the answer."""
    pools = _fill_pools(s, nodes)
    fixed = _fixed_pages(s, nodes)
    shares = sum(p.fill_share for p in pools)

    def pages_at(budget: int) -> dict[str, int]:
        return dict(fixed, **{p.name: _pool_pages(budget, p, shares) for p in pools})

    def fits(budget: int) -> bool:
        return tally_ledger(s, index, nodes, pages_at(budget)).free >= 0

    def largest(lo: int, hi: int) -> int:
        """The largest budget in [lo, hi) that fits, given that lo does and the total grows between;
        it stops once every budget in [lo, hi) gives the same pages."""
        while pages_at(lo) != pages_at(hi - 1):
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    empty = tally_ledger(s, index, nodes, pages_at(0))
    if not pools:
        return empty
    base, top = max(0, empty.free - FILL_WINDOW), max(0, empty.free) + FILL_WINDOW
    starts = [base] + _band_starts(pools, shares, base, top)
    ends = starts[1:] + [top + 1]
    best = next((largest(b, e) for b, e in reversed(list(zip(starts, ends))) if fits(b)), None)
    if best is None and empty.free >= 0:       # not even `base` fits: search below it
        best = largest(0, base)
    return tally_ledger(s, index, nodes, pages_at(best)) if best is not None else empty


def _pool_pages(budget: int, p: PagedKVSpec, shares: float) -> int:
    """The pages a fill pool gets of a device's budget: its fill_share of it, in whole pages."""
    return max(0, int(budget * p.fill_share / shares) // p.page_bytes)


def _least_budget(pages: int, p: PagedKVSpec, shares: float) -> int:
    """The least budget that gives the pool `pages` pages."""
    budget = int(pages * p.page_bytes * shares / p.fill_share)
    while budget > 0 and _pool_pages(budget - 1, p, shares) >= pages:
        budget -= 1
    while _pool_pages(budget, p, shares) < pages:
        budget += 1
    return budget


def _band_starts(pools: list[PagedKVSpec], shares: float, lo: int, hi: int) -> list[int]:
    """Budgets in (lo, hi] at which some fill pool first enters an allocator size band (see
    segment_size): past 1 MiB (the small pool's limit), at 10 MiB (a segment of its own) or past a
    multiple of 2 MiB (the rounding)."""
    out = set()
    for p in pools:
        pb = p.page_bytes
        k_lo, k_hi = _pool_pages(lo, p, shares), _pool_pages(hi, p, shares)       # its pages over the range
        firsts = {SMALL_SIZE // pb + 1, -(-MIN_LARGE_ALLOC // pb)}
        firsts |= {e // pb + 1 for e in range(k_lo * pb - k_lo * pb % ROUND_LARGE, k_hi * pb + 1, ROUND_LARGE)}
        out |= {_least_budget(k, p, shares) for k in firsts if k_lo < k <= k_hi}
    return sorted(out)


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
               f" (estimated), then fewest bytes crossing devices ({crossing_bytes(s, a):,} B a step at the "
               f"budgets); chosen {describe(s, a)}"
               + (f"; next best {describe(s, runner)}" if runner else ""))
    else:
        why = "one device"
    out = Placement(a, devices, why)
    out.check(s)
    return out
