"""One node of a step on the GPU: replay the captured graph of its rung, or run it eagerly past the
captured rungs.

Replay: the step's inputs are copied into the family's static input buffers at the rung's shapes (each
dim padded at its end with zeros), the rung's backends are planned on the real layout padded to the
rung (a paged rung takes exactly rung.seqs sequences and rung.rows rows: padding rows join the last
sequence, or padding sequences of one row sit on the scratch page; a state rung's padding sequences sit
on the padding slot), the graph replays, and the outputs
are views of the static output buffers. Padding rows compute garbage that nothing reads: no real row
attends to a later row, padding K/V lands on the scratch page or past a sequence's length (rewritten
before it is read), and only real rows are sampled or spliced.
"""
from __future__ import annotations

import math

import torch

from graphc.runtime.boot import DeviceBoot
from graphc.step import StepContext
from resources.linear_state import LinearStateSpec, pad_state
from resources.paged_kv import PagedKVSpec
from resources.ragged_attention import RaggedAttentionSpec


def pad_paged(qo: list[int], kv: list[int], tables: list[list[int]], rows: int, seqs: int, page_size: int,
              scratch: int) -> tuple[list[int], list[int], list[list[int]]]:
    """A paged layout padded to exactly `seqs` sequences and `rows` rows (see the module's docstring)."""
    qo, kv, tables = list(qo), list(kv), [list(t) for t in tables]
    pad = rows - sum(qo)
    if pad < 0 or len(qo) > seqs:
        raise ValueError(f"{len(qo)} sequences of {sum(qo)} rows do not fit a rung of {seqs} and {rows}")
    spare = seqs - len(qo)
    if pad and spare == 0:                       # every sequence slot is real: the last one takes the rows
        qo[-1] += pad
        kv[-1] += pad
        need = -(-kv[-1] // page_size)
        tables[-1] = tables[-1][:need] + [scratch] * max(0, need - len(tables[-1]))
        return qo, kv, tables
    for i in range(spare):                       # spread the padding rows over spare sequences on the scratch page
        n = pad // spare + (i < pad % spare)
        qo.append(n)
        kv.append(max(n, 1))
        tables.append([scratch] * -(-max(n, 1) // page_size))
    return qo, kv, tables


def _fill(view: torch.Tensor, value: torch.Tensor) -> None:
    """view (the rung's shape) = value padded with zeros at the end of each dim."""
    if tuple(view.shape) != tuple(value.shape):
        view.zero_()
        view = view[tuple(slice(0, n) for n in value.shape)]
    view.copy_(value, non_blocking=True)


class GpuSteps:
    def __init__(self, boot: DeviceBoot, scratch: dict[str, int]):
        self.boot = boot
        self.graphs = boot.runtime                # gpu.Graphs of the boot: buffers, backends, captured graphs
        self.scratch = scratch                    # paged pool -> its scratch page; state pool -> its padding slot
        self.steps = {(s.node, s.walk): s for s in boot.ir.steps}
        self._eager: dict[tuple[str, str], dict] = {}

    def run(self, node: str, walk: str, rung: int | None, size: int, inputs: dict, layouts: dict) -> dict:
        step = self.steps[(node, walk)]
        if rung is None:
            return self._eager_run(node, step, inputs, layouts)
        ir, g = self.boot.ir, self.graphs
        family = step.family
        fstep = ir.family(node, family)
        sizes = fstep.sizes_at(rung)
        decl = ir.node(node)
        bufs = g.io[(node, family)]
        for p in fstep.inputs:
            shape = decl.inputs[p].concrete(sizes)
            _fill(bufs[f"in.{p}"][:math.prod(shape)].view(shape), inputs[p])
        binds = g.backends[(node, family, rung)]
        for role, res in decl.resources.items():
            spec = ir.model.resource(res)
            if isinstance(spec, RaggedAttentionSpec):
                binds[role].plan(layouts[role], layouts[role])
            elif isinstance(spec, LinearStateSpec):
                binds[role].plan(*pad_state(*layouts[role], len(binds[role].seq_lens), self.scratch[res]))
            else:
                shape = binds[role].rung
                binds[role].plan(*pad_paged(*layouts[role], shape.rows, shape.seqs, spec.page_size,
                                             self.scratch[res]))
        self.boot.graphs[f"{node}/{family}/{rung}"].replay()
        out = {}
        for p, port in decl.outputs.items():
            shape = port.concrete(sizes)
            out[p] = bufs[f"out.{p}"][:math.prod(shape)].view(shape)
        return out

    def _eager_run(self, node: str, step, inputs: dict, layouts: dict) -> dict:
        ir, g = self.boot.ir, self.graphs
        decl = ir.node(node)
        key = (node, step.phase)
        if key not in self._eager:                # one eager backend per node and phase, reused
            self._eager[key] = {role: g.backend_for(res, step, None, False) for role, res in decl.resources.items()}
        binds = self._eager[key]
        for role, res in decl.resources.items():
            spec = ir.model.resource(res)
            if isinstance(spec, LinearStateSpec):
                binds[role].plan(*layouts[role])
            elif isinstance(spec, RaggedAttentionSpec):
                binds[role].plan(layouts[role], layouts[role])
            elif isinstance(spec, PagedKVSpec):
                binds[role].plan(*layouts[role])
        with torch.inference_mode():
            return self.boot.modules[node](StepContext(binds, self.boot.reduce), **inputs)
