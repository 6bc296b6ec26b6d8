"""Choose capture rungs per node per walk: a ladder up to each walk's budget (DESIGN.md's rule).

Every step size 1..budget maps to the smallest rung that holds it; the largest rung is the first
that holds the budget (the budget itself when it is off the ladder); no rung lies past it. Steps
of one node in one graph family capture the union of their rungs. A capture_limit cuts the rungs
a node captures on a walk; steps above it run eagerly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from graphc.ir import IR, Step


def default_ladder(limit: int) -> list[int]:
    """1, 2, 4, 8, then powers of two with their midpoints (12, 16, 24, 32, 48, ...), up to limit."""
    out, p = [], 1
    while p <= limit:
        out.append(p)
        if p >= 8 and p + p // 2 <= limit:
            out.append(p + p // 2)
        p *= 2
    return sorted(out)


def rungs_for(budget: int, ladder: tuple[int, ...] | list[int] | None = None) -> list[int]:
    """The ladder's rungs below the budget, then the budget itself."""
    base = list(ladder) if ladder is not None else default_ladder(budget)
    return [r for r in base if r < budget] + [budget]


def rung_for(size: int, rungs: list[int]) -> int | None:
    """The smallest rung that holds a step of this size, or None when none does."""
    for r in rungs:
        if r >= size:
            return r
    return None


@dataclass(frozen=True)
class Buckets:
    walk_rungs: dict[tuple[str, str], list[int]]          # (node, walk) -> rungs the walk's steps map to
    captured: dict[tuple[str, str], list[int]]            # (node, family) -> captured rungs (union)
    eager: dict[tuple[str, str], int]                     # (node, walk) -> largest step run eagerly, if any
    why: dict[tuple[str, str], str] = field(default_factory=dict)

    def graphs(self) -> list[tuple[str, str, int]]:
        return [(n, fam, r) for (n, fam), rs in self.captured.items() for r in rs]

    def check(self, ir: IR) -> None:
        for s in ir.steps:
            rungs = self.walk_rungs[(s.node, s.walk)]
            assert rungs == sorted(set(rungs)) and rungs[-1] >= s.budget, f"bad rungs {s}"
            assert sum(r >= s.budget for r in rungs) == 1, f"rungs past the budget: {s}"


def choose_buckets(ir: IR) -> Buckets:
    walk_rungs, captured, eager, why = {}, {}, {}, {}
    for s in ir.steps:
        rungs = rungs_for(s.budget, s.ladder)
        walk_rungs[(s.node, s.walk)] = rungs
        cap = _captured(s, rungs)
        key = (s.node, s.family)
        captured.setdefault(key, set()).update(cap)
        if not cap or cap[-1] < s.budget:
            eager[(s.node, s.walk)] = s.budget
        why[(s.node, s.walk)] = _why(s, rungs, cap)
    out = Buckets(walk_rungs, {k: sorted(v) for k, v in captured.items() if v}, eager, why)
    out.check(ir)
    return out


def _captured(s: Step, rungs: list[int]) -> list[int]:
    if not s.capture:
        return []
    if s.capture_limit is not None:
        return [r for r in rungs if r <= s.capture_limit]
    return rungs


def _why(s: Step, rungs: list[int], cap: list[int]) -> str:
    src = f"ladder {list(s.ladder)}" if s.ladder else "the default ladder (1,2,4,8 then 2^k and 1.5x2^k)"
    text = f"{s.axis} budget {s.budget} on walk {s.walk}: rungs of {src} below it, then {s.budget} itself"
    if not s.capture:
        text += "; not captured (the walk or target runs eagerly)"
    elif cap != rungs:
        text += f"; captured up to {cap[-1] if cap else 0} (capture_limit), larger steps run eagerly"
    return text
