"""Decide whether a placement fits: every device within its capacity, every KV pool able to hold
the longest request it allows."""
from __future__ import annotations

from dataclasses import dataclass

from graphc.passes.place_nodes import Placement
from graphc.passes.tally_ledger import Sizing
from graphc.units import fmt_bytes
from resources.paged_kv import PagedKVSpec


@dataclass(frozen=True)
class Problem:
    device: int
    text: str
    over_bytes: int     # bytes past capacity (0 for a KV pool that is too small)


@dataclass(frozen=True)
class Fit:
    problems: list[Problem]

    @property
    def fits(self) -> bool:
        return not self.problems


def check_fit(s: Sizing, placement: Placement) -> Fit:
    problems = []
    for d in placement.devices:
        if d.free < 0:
            top = sorted(d.items, key=lambda i: -i.bytes)[:4]
            parts = ", ".join(f"{i.component} {fmt_bytes(i.bytes)}" for i in top)
            problems.append(Problem(d.index, f"device {d.index} needs {fmt_bytes(d.total)} of {fmt_bytes(d.capacity)}"
                                              f" ({fmt_bytes(-d.free)} over): {parts}, ...", -d.free))
        for res, pages in d.kv_pages.items():
            spec = s.ir.model.resource(res)
            if isinstance(spec, PagedKVSpec) and pages < spec.min_pages:
                held = pages * spec.page_size
                problems.append(Problem(d.index, f"KV pool '{res}' on device {d.index} holds {pages} pages"
                                                 f" ({held:,} tokens); the longest allowed request ({spec.max_seq_len:,}"
                                                 f" tokens) needs {spec.min_pages} pages of {spec.page_size}", 0))
    return Fit(problems)
