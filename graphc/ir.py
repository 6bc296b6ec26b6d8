"""The typed IR the passes share: a declared model, resolved against a target, as a graph.

Built once from a (possibly overridden) declaration; passes read it and hand their own typed
results onward (graphc/passes/*). The networkx graph holds nodes and port-level edges.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property

import networkx as nx

from graphc.declare import Model, Node, Walk, parse_dim
from graphc.errors import InvalidInput
from graphc.targets import Target

PHASE = {"decode": "decode", "prefill": "prefill", "mixed": "prefill", "encode": "prefill", "chunk": "prefill"}


@dataclass(frozen=True)
class Step:
    """One node as one walk runs it: the axis it is captured along, its budget, the ports fed."""

    node: str
    walk: str
    kind: str
    axis: str
    budget: int
    sizes: tuple[tuple[str, int], ...]     # every axis size at the walk's budget (tokens alias in decode)
    inputs: tuple[str, ...]                # input ports fed on this walk
    groups: tuple[str, ...]                # optional input groups fed on this walk
    capture: bool
    capture_limit: int | None
    ladder: tuple[int, ...] | None

    @property
    def phase(self) -> str:
        return PHASE[self.kind]

    @property
    def slot(self) -> int | None:
        """Rows of one slot when the walk is a chunk walk with a seqs budget: its steps carry whole slots
        of budget/seqs rows each (an audio decoder's chunks), and seqs counts the slots of a rung."""
        seqs = dict(self.sizes).get("seqs")
        if self.kind != "chunk" or seqs is None or self.axis == "seqs":
            return None
        return self.budget // seqs

    @property
    def family(self) -> str:
        """Steps of one node with the same family share captured graphs (their rungs are unioned)."""
        slot = f"@{self.slot}" if self.slot else ""
        return f"{self.phase}:{self.axis}{slot}" + "".join(f"+{g}" for g in self.groups)

    def sizes_at(self, rung: int) -> dict[str, int]:
        """Axis sizes of a step at one rung: the capture axis takes the rung, the others their budget
        (in a chunk walk, seqs is the rung's slots)."""
        sizes = dict(self.sizes)
        sizes[self.axis] = rung
        if self.slot:
            sizes["seqs"] = -(-rung // self.slot)
        if self.kind == "decode":
            sizes["tokens"] = sizes["seqs"]
        if self.axis == "tokens" and "seqs" in sizes:
            sizes["seqs"] = min(sizes["seqs"], rung)
        return sizes


@dataclass
class IR:
    model: Model
    target: Target
    num_devices: int
    graph: nx.MultiDiGraph = field(repr=False)
    steps: tuple[Step, ...]

    def node(self, name: str) -> Node:
        return self.model.node(name)

    def steps_of(self, node: str) -> list[Step]:
        return [s for s in self.steps if s.node == node]

    def family(self, node: str, family: str) -> Step:
        return family_step([s for s in self.steps if s.node == node and s.family == family])

    def transfers_into(self, nodes: list[str]) -> list[tuple[str, str, int, str]]:
        """The static receive buffers of a device that holds `nodes`, (source, port, elements, dtype), each
        as large as its port is at the largest step of the walks that size it (their budget sizes):
        - each edge into one of them from a node elsewhere arrives in a buffer of its source port;
        - a linked node here driven from a node elsewhere (declare.Link) receives each linked input,
          (link source, 'node.port'), sized by the linked node's steps;
        - a linked node elsewhere driven from a node here sends back each linked output, (node, port)."""
        out = {}

        def add(key: tuple[str, str], sized_by: str, spec) -> None:
            if key not in out:
                numel = max(math.prod(spec.concrete(s.sizes_at(s.budget))) for s in self.steps_of(sized_by))
                out[key] = (*key, numel, spec.dtype)

        for e in self.model.edges:
            (src, port), (dst, _) = e.ends()
            if dst in nodes and src not in nodes:
                add((src, port), src, self.node(src).outputs[port])
        for link in self.model.links:
            dst = self.node(link.dst)
            if link.dst in nodes and link.src not in nodes:
                for port in link.inputs:
                    add(link.input_key(port), link.dst, dst.inputs[port])
            elif link.src in nodes and link.dst not in nodes:
                for port in link.outputs:
                    add((link.dst, port), link.dst, dst.outputs[port])
        return list(out.values())

    @cached_property
    def users(self) -> dict[str, list[tuple[str, str]]]:
        """resource -> [(node, role)] that call it."""
        out: dict[str, list[tuple[str, str]]] = {r.name: [] for r in self.model.resources}
        for n in self.model.nodes:
            for role, res in n.resources.items():
                out.setdefault(res, []).append((n.name, role))
        return out

    def check(self) -> None:
        """Structural invariants every pass may rely on (verified on entry and exit)."""
        names = {n.name for n in self.model.nodes}
        assert set(self.graph.nodes) == names, "IR graph nodes differ from the declaration"
        for s in self.steps:
            assert s.node in names and s.budget >= 1, f"bad step {s}"
        assert 1 <= self.num_devices, "at least one device"


def family_step(steps: list[Step]) -> Step:
    """One step standing for every walk of a graph family: each axis at its largest budget (the
    family's captured graphs and static buffers are sized by it)."""
    sizes: dict[str, int] = {}
    for s in steps:
        for axis, n in s.sizes:
            sizes[axis] = max(sizes.get(axis, 0), n)
    return replace(steps[0], walk="+".join(s.walk for s in steps), budget=max(s.budget for s in steps),
                   sizes=tuple(sorted(sizes.items())))


def capture_axis(node: Node, walk: Walk) -> str:
    """A node is captured along its first input's leading axis unless the walk says otherwise;
    decode walks budget sequences, one token each, so 'tokens' becomes 'seqs' there."""
    if node.name in walk.axes:
        return walk.axes[node.name]
    first = next(iter(node.inputs.values()), None)
    axis = parse_dim(first.shape[0])[0] if first is not None and first.shape else None
    if axis is None:
        raise InvalidInput(f"node '{node.name}' has no symbolic leading dimension on its first input",
                           "the compiler captures a node along its first input's leading axis",
                           f"give {node.name}'s first input a leading axis, or set walks.{walk.name}.axes.{node.name}")
    return "seqs" if walk.kind == "decode" and axis == "tokens" else axis


def fed_inputs(model: Model, node: Node, walk: Walk) -> tuple[str, ...]:
    """Required inputs, plus each optional group that an edge from a node on this walk feeds."""
    on_walk = set(walk.path)
    groups = set()
    for e in model.edges:
        (src, _), (dst, port) = e.ends()
        if dst == node.name and src in on_walk and node.inputs[port].optional:
            groups.add(node.inputs[port].optional)
    return tuple(p for p, port in node.inputs.items() if port.optional is None or port.optional in groups)


def walk_sizes(walk: Walk) -> dict[str, int]:
    sizes = dict(walk.budget.axes())
    if walk.kind == "decode" and "seqs" in sizes:
        sizes["tokens"] = sizes["seqs"]
    return sizes


def check_slots(walk: Walk, node: str, budget: int, seqs: int) -> None:
    """A chunk walk's steps are whole slots: its budget and every rung a multiple of budget/seqs."""
    slot = budget // seqs
    bad = [r for r in (walk.ladder_of(node) or ()) if r % slot] if budget % seqs == 0 else [budget]
    if bad:
        raise InvalidInput(f"walk '{walk.name}' carries {node}'s {budget} rows in {seqs} slots of {budget / seqs:g} "
                           f"rows, but {bad} {'are' if len(bad) > 1 else 'is'} not a whole number of slots",
                           "a chunk walk's seqs budget counts slots of equal length: its budget and every "
                           "ladder rung must be a multiple of the slot",
                           f"make the budget {seqs} x the slot length and each rung a multiple of it")


MAX_TENSOR_BYTES = 2**63 - 1      # torch counts a tensor's bytes in a signed 64-bit int


def check_port_sizes(walk: Walk, node: Node, sizes: dict[str, int]) -> None:
    """Every port of a node on a walk is a tensor torch can size at the walk's budget (a budget of 10**30
    is refused here, before the simulation asks torch for such a tensor)."""
    for pname, port in {**node.inputs, **node.outputs}.items():
        nbytes = port.nbytes(sizes) if port.axes() <= set(sizes) else 0
        if nbytes > MAX_TENSOR_BYTES:
            raise InvalidInput(f"walk '{walk.name}': port {node.name}.{pname} {list(port.shape)} would hold about "
                               f"2**{nbytes.bit_length() - 1} bytes at the walk's budget",
                               "no tensor holds more than 2**63 - 1 bytes (torch counts them in 64 bits)",
                               f"lower walks.{walk.name}.budget, or {node.name}'s port sizes")


def build_ir(model: Model, target: Target, num_devices: int) -> IR:
    graph = nx.MultiDiGraph()
    for n in model.nodes:
        graph.add_node(n.name)
    for e in model.edges:
        (src, sp), (dst, dp) = e.ends()
        graph.add_edge(src, dst, src_port=sp, dst_port=dp)
    steps = []
    for w in model.walks:
        sizes = walk_sizes(w)
        for name in w.path:
            node = model.node(name)
            check_port_sizes(w, node, sizes)
            axis = capture_axis(node, w)
            budget = sizes.get(axis)
            if w.kind == "chunk" and "seqs" in sizes and axis != "seqs" and budget:
                check_slots(w, name, budget, sizes["seqs"])
            steps.append(Step(node=name, walk=w.name, kind=w.kind, axis=axis, budget=budget or 0,
                              sizes=tuple(sorted(sizes.items())), inputs=fed_inputs(model, node, w),
                              groups=tuple(sorted({node.inputs[p].optional for p in fed_inputs(model, node, w)} - {None})),
                              capture=w.capture and target.capture, capture_limit=w.capture_limit.get(name),
                              ladder=w.ladder_of(name)))
    return IR(model=model, target=target, num_devices=num_devices, graph=graph, steps=tuple(steps))
