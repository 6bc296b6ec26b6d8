"""Trace every captured rung and every eager step of every node under fake tensors."""
from __future__ import annotations

import sys
from dataclasses import dataclass

from tqdm import tqdm

from graphc.ir import IR, Step, family_step
from graphc.passes.choose_buckets import Buckets
from graphc.passes.select_backends import Backends
from graphc.convws import resolve
from graphc.simulate import FakeNode, Trace


@dataclass(frozen=True)
class Graph:
    """One captured graph: a node's family at one rung."""

    node: str
    family: str
    rung: int
    step: Step           # the family's merged step (largest budget of each axis)


@dataclass(frozen=True)
class Activations:
    graphs: dict[tuple[str, str, int], tuple[Graph, Trace]]   # (node, family, rung)
    eager: dict[tuple[str, str], Trace]                        # (node, walk) at the walk's budget
    io: dict[tuple[str, str], list[tuple[str, int]]]           # (node, family) -> static buffers
    uncalibrated: frozenset[str] = frozenset()                 # convolutions with no measured workspace

    def check(self, ir: IR, buckets: Buckets) -> None:
        assert set(self.graphs) == set(buckets.graphs()), "a captured rung was not simulated"
        assert set(self.eager) == set(buckets.eager), "an eager step was not simulated"


def bindings(ir: IR, step: Step, rung: int, backends: Backends | None = None) -> dict:
    """Fake resources for one step; a backend that pads the head dim allocates what it pads."""
    node, sizes = ir.node(step.node), step.sizes_at(rung)
    out = {}
    for role, res in node.resources.items():
        spec = ir.model.resource(res)
        runs = backends.chosen[res].head_dim if backends is not None else None
        out[role] = spec.fake(spec.step_shape(step.axis, sizes, step.phase), runs)
    return out


_FAKES: dict[tuple, FakeNode] = {}
_TRACES: dict[tuple, Trace] = {}


def _node_key(node) -> tuple:
    return (node.module, repr(node.config), node.dtype)


def fake_node(node) -> FakeNode:
    """Fake modules and traces are cached across re-plans (remedy search re-plans many times)."""
    key = _node_key(node)
    if key not in _FAKES:
        _FAKES[key] = FakeNode(node)
    return _FAKES[key]


def simulate_steps(ir: IR, buckets: Buckets, backends: Backends | None = None) -> Activations:
    families: dict[tuple[str, str], Step] = {}
    for s in ir.steps:
        families.setdefault((s.node, s.family), [])
    for key in families:
        families[key] = family_step([s for s in ir.steps if (s.node, s.family) == key])
    total = len(buckets.graphs()) + len(buckets.eager)
    graphs, eager, io = {}, {}, {}
    with tqdm(total=total, desc="simulating steps", unit="step", file=sys.stderr, disable=None,
              leave=False) as bar:
        def trace(step: Step, rung: int) -> Trace:
            node = ir.node(step.node)
            sizes = step.sizes_at(rung)
            ports = {p: node.inputs[p] for p in step.inputs}
            specs = tuple((repr(ir.model.resource(r)), backends.chosen[r].head_dim if backends else None)
                          for r in node.resources.values())
            key = (_node_key(node), repr(ports), repr(node.outputs), tuple(sorted(sizes.items())), step.phase,
                   step.axis, specs)
            if key not in _TRACES:
                where = f"node '{step.node}' on {step.walk} at {step.axis}={rung}"
                _TRACES[key] = fake_node(node).trace(ports, sizes, bindings(ir, step, rung, backends), where)
            bar.update(1)
            return _TRACES[key]

        for (name, fam), rungs in buckets.captured.items():
            step = families[(name, fam)]
            for r in rungs:
                graphs[(name, fam, r)] = (Graph(name, fam, r, step), trace(step, r))
            io[(name, fam)] = static_buffers(ir, step, rungs[-1])
        for (name, walk), size in buckets.eager.items():
            step = next(s for s in ir.steps if s.node == name and s.walk == walk)
            eager[(name, walk)] = trace(step, size)
    missing: set[str] = set()
    if ir.target.is_gpu:     # cuDNN's convolution workspaces, measured per signature on the arch
        def with_ws(t: Trace) -> Trace:
            resolved, miss = resolve(t, ir.target.arch)
            missing.update(miss)
            return resolved
        graphs = {k: (g, with_ws(t)) for k, (g, t) in graphs.items()}
        eager = {k: with_ws(t) for k, t in eager.items()}
    out = Activations(graphs, eager, io, frozenset(missing))
    out.check(ir, buckets)
    return out


def static_buffers(ir: IR, step: Step, rung: int) -> list[tuple[str, int]]:
    """Inputs and outputs a captured family keeps at its largest rung; smaller rungs use slices."""
    node, sizes = ir.node(step.node), step.sizes_at(rung)
    bufs = [(f"in.{p}", node.inputs[p].nbytes(sizes)) for p in step.inputs]
    return bufs + [(f"out.{p}", port.nbytes(sizes)) for p, port in node.outputs.items()]
