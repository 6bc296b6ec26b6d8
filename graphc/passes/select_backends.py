"""Pick a kernel backend per attention resource from the arch's capability table."""
from __future__ import annotations

from dataclasses import dataclass

from graphc.ir import IR
from resources import capabilities


@dataclass(frozen=True)
class Backends:
    chosen: dict[str, str]       # resource -> backend
    why: dict[str, str]          # resource -> reason, for explain

    def check(self, ir: IR) -> None:
        for r in ir.model.resources:
            if r.is_attention:
                assert r.name in self.chosen, f"no backend for {r.name}"


def select_backends(ir: IR) -> Backends:
    chosen, why = {}, {}
    arch, target = ir.target.arch, ir.target.name
    for r in ir.model.resources:
        if not r.is_attention:
            continue
        options = capabilities.available(r.kind, arch)
        chosen[r.name] = capabilities.choose(r.kind, arch, r.backend, r.name, target)
        why[r.name] = (f"requested '{r.backend}'" if r.backend != "auto" else "auto: first in preference order") + \
            f"; {arch} has {', '.join(options)}"
    out = Backends(chosen, why)
    out.check(ir)
    return out
