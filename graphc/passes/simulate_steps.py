"""Trace every captured rung and every eager step of every node under fake tensors."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tqdm import tqdm

from graphc import forkpool, memo
from graphc.convws import resolve
from graphc.ir import IR, Step
from graphc.modules import node_key, set_kernels
from graphc.passes.choose_buckets import Buckets
from graphc.passes.select_backends import Backends
from graphc.trace import Trace

if TYPE_CHECKING:
    from graphc.simulate import FakeNode


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
        out[role] = spec.fake(spec.step_shape(step.axis, sizes, step.phase), _head_dim(backends, res))
    return out


def _head_dim(backends: Backends | None, res: str) -> int | None:
    """The head dim an attention resource's kernels run (None: no backend chosen, or not attention)."""
    chosen = backends.chosen.get(res) if backends is not None else None
    return chosen.head_dim if chosen is not None else None


_FAKES: dict[tuple, FakeNode] = memo.table("simulate_steps.fakes")
_TRACES: dict[tuple, tuple[Trace, frozenset[str]]] = memo.table("simulate_steps.traces")


def fake_node(node) -> FakeNode:
    """Fake modules are kept across re-plans (remedy search re-plans many times)."""
    key = node_key(node)
    if key not in _FAKES:
        from graphc.simulate import FakeNode        # torch: a plan whose traces are all cached never imports it

        _FAKES[key] = FakeNode(node)
    return _FAKES[key]


def _trace_key(ir: IR, step: Step, rung: int, backends: Backends | None) -> tuple:
    """Everything a step's trace depends on."""
    node = ir.node(step.node)
    ports = {p: node.inputs[p] for p in step.inputs}
    specs = tuple((repr(ir.model.resource(r)), _head_dim(backends, r)) for r in node.resources.values())
    arch = ir.target.arch if ir.target.is_gpu else None
    knobs = backends.kernels.get(step.node, {}) if backends else {}
    return (node_key(node), repr(ports), repr(node.outputs), tuple(sorted(step.sizes_at(rung).items())), step.phase,
            step.axis, specs, arch, tuple(sorted(knobs.items())))


def _compute(ir: IR, step: Step, rung: int, backends: Backends | None) -> tuple[Trace, frozenset[str]]:
    node = ir.node(step.node)
    sizes = step.sizes_at(rung)
    arch = ir.target.arch if ir.target.is_gpu else None
    where = f"node '{step.node}' on {step.walk} at {step.axis}={rung}"
    fake = fake_node(node)
    set_kernels(fake.module, backends.kernels.get(step.node, {}) if backends else {})
    trace = fake.trace({p: node.inputs[p] for p in step.inputs}, sizes, bindings(ir, step, rung, backends), where)
    return resolve(trace, arch) if arch else (trace, frozenset())


def trace_step(ir: IR, step: Step, rung: int, backends: Backends | None) -> tuple[Trace, frozenset[str]]:
    """One step's trace at one rung, with each convolution's measured cuDNN workspace on a GPU
    target, and the convolution signatures that have none. Memoized by everything it depends on."""
    key = _trace_key(ir, step, rung, backends)
    if key not in _TRACES:
        _TRACES[key] = _compute(ir, step, rung, backends)
    return _TRACES[key]


def _compute_batch(ir: IR, batch: list[tuple[Step, int]], backends: Backends | None) -> list:
    return [_compute(ir, step, rung, backends) for step, rung in batch]


def prefetch(ir: IR, jobs: list[tuple[Step, int]], backends: Backends | None, bar) -> set[tuple]:
    """Trace the jobs not yet in the memo on a pool of forked workers (graphc/forkpool.py), into the memo;
    the keys done. A trace is a pure function of its key, so where it ran changes nothing.

    A worker takes a batch of one step family's rungs, at most a 2n-th of the traces for n workers: a process
    traces a family's later rungs faster than its first (the meta kernels' layouts it has seen are cached,
    simulate._META_CACHE), and rungs dealt out one by one had each worker pay every family's first trace
    (on 2 workers, 3.4 s of tracing where one process took 2.3 s)."""
    todo, seen = [], set()
    for step, rung in jobs:
        key = _trace_key(ir, step, rung, backends)
        if key not in _TRACES and key not in seen:
            seen.add(key)
            todo.append((key, step, rung))
    n = forkpool.size(len(todo))
    if not n:
        return set()
    for node in {step.node for _, step, _ in todo}:     # built once here, inherited by every worker
        fake_node(ir.node(node))
    families: dict[tuple[str, str], list] = {}
    for job in todo:
        families.setdefault((job[1].node, job[1].walk), []).append(job)
    most = -(-len(todo) // (2 * n))
    batches = [f[i:i + most] for f in families.values() for i in range(0, len(f), most)]
    # the dearest first (a node with a nested per-frame model), so that the workers end together
    size = {node: sum(1 for _ in fake_node(ir.node(node)).module.modules()) for node, _ in families}
    batches.sort(key=lambda b: -len(b) * size[b[0][1].node])
    n = min(n, len(batches))
    if n < 2:                                          # one batch: this process traces it as well as a worker
        return set()
    done = set()
    args = [(ir, [(step, rung) for _, step, rung in b], backends) for b in batches]
    for i, results in forkpool.imap(_compute_batch, args, n):
        if results is not None:                        # else traced again below, where it raises
            for (key, _, _), result in zip(batches[i], results):
                _TRACES[key] = result
                done.add(key)
            bar.update(len(results))
    return done


def simulate_steps(ir: IR, buckets: Buckets, backends: Backends | None = None) -> Activations:
    families = {key: ir.family(*key) for key in buckets.captured}
    total = len(buckets.graphs()) + len(buckets.eager)
    graphs, eager, io = {}, {}, {}
    missing: set[str] = set()      # convolutions with no measured cuDNN workspace

    def trace(step: Step, rung: int) -> Trace:
        key = _trace_key(ir, step, rung, backends)
        t, miss = trace_step(ir, step, rung, backends)
        missing.update(miss)
        if key not in prefetched:
            bar.update(1)
        return t

    jobs = [(families[k], r) for k, rungs in buckets.captured.items() for r in rungs]
    jobs += [(next(s for s in ir.steps if s.node == n and s.walk == w), size) for (n, w), size in buckets.eager.items()]
    with tqdm(total=total, desc="simulating steps", unit="step", file=sys.stderr, disable=None,
              leave=False) as bar:
        prefetched = prefetch(ir, jobs, backends, bar)
        for (name, fam), rungs in buckets.captured.items():
            step = families[(name, fam)]
            for r in rungs:
                graphs[(name, fam, r)] = (Graph(name, fam, r, step), trace(step, r))
            io[(name, fam)] = static_buffers(ir, step, rungs[-1])
        for (name, walk), size in buckets.eager.items():
            step = next(s for s in ir.steps if s.node == name and s.walk == walk)
            eager[(name, walk)] = trace(step, size)
    out = Activations(graphs, eager, io, frozenset(missing))
    out.check(ir, buckets)
    return out


def static_buffers(ir: IR, step: Step, rung: int) -> list[tuple[str, int]]:
    """Inputs and outputs a captured family keeps at its largest rung; smaller rungs use slices."""
    node, sizes = ir.node(step.node), step.sizes_at(rung)
    bufs = [(f"in.{p}", node.inputs[p].nbytes(sizes)) for p in step.inputs]
    return bufs + [(f"out.{p}", port.nbytes(sizes)) for p, port in node.outputs.items()]
