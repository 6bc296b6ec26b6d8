"""Size what resources hold: float workspaces (formula per backend, checked against declared
ones), the fixed buffers of every captured wrapper, and the slots of linear-attention state (one per
sequence the node's decode walk runs at once, and one for a captured step's padding rows). KV pools are
sized at placement, from what these leave."""
from __future__ import annotations

from dataclasses import dataclass, field

from graphc.errors import InvalidInput
from graphc.ir import IR
from graphc.passes.choose_buckets import Buckets
from graphc.passes.select_backends import Backends
from graphc.units import MiB, fmt_bytes, round_up
from resources.base import Sized
from resources.linear_state import LinearStateSpec
from resources.workspace import WorkspaceSpec


@dataclass(frozen=True)
class Workspace:
    name: str            # a declared WorkspaceSpec, or '<resource>' for one the compiler sized
    bytes: int           # total (all slots)
    users: tuple[str, ...]
    need: Sized          # the largest need of any user at any step
    declared: bool


@dataclass(frozen=True)
class StateSlots:
    slots: int           # slots allocated, the padding slot included
    streams: int         # sequences that hold one at once
    walk: str            # the walk whose seqs budget sets streams
    why: str


@dataclass(frozen=True)
class ResourceSizes:
    workspaces: dict[str, Workspace]
    wrappers: dict[tuple[str, str, int], list[tuple[str, str, int]]]   # graph -> [(resource, buffer, bytes)]
    state: dict[str, StateSlots] = field(default_factory=dict)        # linear_state resource -> its slots

    def check(self, ir: IR) -> None:
        for ws in self.workspaces.values():
            assert ws.bytes >= ws.need.bytes, f"workspace {ws.name} smaller than its need"


def _shapes(ir: IR, buckets: Buckets, res: str):
    """Every (step, size) at which a node calls this resource: each captured graph at its family's
    merged step (what the runtime captures it with: each axis at its largest budget), and every rung
    of a walk that runs eagerly at some sizes."""
    for (node, fam), rungs in buckets.captured.items():
        if res in ir.node(node).resources.values():
            step = ir.family(node, fam)
            yield from ((step, r) for r in rungs)
    for s in ir.steps:
        if res in ir.node(s.node).resources.values() and (s.node, s.walk) in buckets.eager:
            yield from ((s, r) for r in buckets.walk_rungs[(s.node, s.walk)])


def size_resources(ir: IR, backends: Backends, buckets: Buckets) -> ResourceSizes:
    needs: dict[str, tuple[Sized, str]] = {}
    for r in ir.model.resources:
        if not r.is_attention:
            continue
        best = Sized(0, f"{backends.backend(r.name)}: no float workspace")
        where = ""
        for s, rung in _shapes(ir, buckets, r.name):
            backend = backends.backend(r.name, s.phase)
            need = r.float_workspace(backend, r.step_shape(s.axis, s.sizes_at(rung), s.phase), ir.target.num_sms,
                                     backends.chosen[r.name].head_dim)
            if need.bytes > best.bytes:
                best, where = need, f"{s.node} on {s.walk} at {s.axis}={rung}"
        needs[r.name] = (best, where)
    workspaces = _workspaces(ir, backends, needs)
    wrappers: dict[tuple[str, str, int], list[tuple[str, str, int]]] = {}
    shared: set[str] = set()           # resources whose one int workspace is counted (its first graph's)
    for (node, fam, rung) in buckets.graphs():
        step = ir.family(node, fam)        # the runtime sizes a graph's wrapper at its family's step
        bufs = []
        for role, res in ir.node(node).resources.items():      # attention wrappers and state bindings
            spec = ir.model.resource(res)
            shape = spec.step_shape(step.axis, step.sizes_at(rung), step.phase)
            if isinstance(spec, LinearStateSpec):
                _captured_state(ir, spec, node, fam, rung, shape)
            for name, n in spec.wrapper_allocs(backends.backend(res, step.phase), shape):
                # a resource's captured wrappers share one int workspace (each replay is planned right
                # before it, one step at a time): counted once, with its first graph
                if name == "int_workspace":
                    if res in shared:
                        continue
                    shared.add(res)
                bufs.append((res, name, n))
        wrappers[(node, fam, rung)] = bufs
    out = ResourceSizes(workspaces, wrappers, {r.name: state_slots(ir, r) for r in ir.model.resources
                                               if isinstance(r, LinearStateSpec)})
    out.check(ir)
    return out


def _captured_state(ir: IR, spec: LinearStateSpec, node: str, fam: str, rung: int, shape) -> None:
    """A captured rung of a node on state slots runs one row per sequence: the prompt rows of linear attention
    run eagerly (the chunked delta rule's kernels size their grid on the host from the step's lengths)."""
    if shape.rows == shape.seqs:
        return
    walks = sorted(s.walk for s in ir.steps if s.node == node and s.family == fam)
    raise InvalidInput(f"{node} would capture {fam} at {rung} ({shape.rows} rows for {shape.seqs} sequences) on "
                       f"'{spec.name}', a linear_state resource",
                       "a captured step on state slots runs one row per sequence (decode); prompt chunks of "
                       "linear attention run eagerly",
                       " or ".join(f"--set walks.{w}.capture=false" for w in walks)
                       + ", or declare those walks with capture=False")


def state_slots(ir: IR, spec: LinearStateSpec) -> StateSlots:
    """A sequence holds its slot from admission to its end, and the engine runs at most its decode walk's
    seqs budget at once: that many slots, plus one that a captured step's padding rows read and write.
    Declared slots must hold as many."""
    users = {n for n, _ in ir.users.get(spec.name, [])}
    walks = [w for w in ir.model.walks if users & set(w.path) and w.budget.seqs]
    decode = [w for w in walks if w.kind == "decode"] or walks
    if not decode:
        raise InvalidInput(f"linear_state resource '{spec.name}' is bound to {sorted(users) or 'no node'}, and no walk "
                           "through them has a seqs budget", "its slots are one per sequence running at once",
                           "give the node's decode walk a seqs budget, or bind the resource to the node it runs")
    walk = max(decode, key=lambda w: w.budget.seqs)
    streams, pad = walk.budget.seqs, int(ir.target.capture and walk.capture)
    why = (f"{streams} sequences at once ({walk.name}'s seqs budget)"
           + (" + 1 for a captured step's padding rows" if pad else "")
           + f", {fmt_bytes(spec.slot_bytes)} each ({spec.num_layers} layers)")
    if spec.slots is None:
        return StateSlots(streams + pad, streams, walk.name, why)
    if spec.slots < streams + pad:
        raise InvalidInput(f"linear_state resource '{spec.name}' declares {spec.slots} slots; {streams + pad} are needed",
                           why, f"--set resources.{spec.name}.slots={streams + pad} (or null: sized by the compiler), "
                                f"or --set walks.{walk.name}.budget.seqs={max(spec.slots - pad, 1)}")
    return StateSlots(spec.slots, streams, walk.name, f"declared {spec.slots}; needs {why}")


def _workspaces(ir: IR, backends: Backends, needs: dict) -> dict[str, Workspace]:
    out = {}
    for r in ir.model.resources:
        if isinstance(r, WorkspaceSpec):
            users = tuple(u.name for u in ir.model.resources if getattr(u, "workspace", None) == r.name)
            need, where = max((needs[u] for u in users), key=lambda nw: nw[0].bytes)
            if r.bytes is None:      # sized by the compiler, like an undeclared one, in every slot
                floor = MiB if ir.target.is_gpu else 0
                per_slot = round_up(max(need.bytes, floor), MiB)
                out[r.name] = Workspace(r.name, per_slot * r.slots, users, need, declared=False)
                continue
            if r.bytes < need.bytes:
                user = next(u for u in users if needs[u][0].bytes == need.bytes)
                raise InvalidInput(
                    f"workspace '{r.name}' holds {fmt_bytes(r.bytes)} per slot; '{user}' needs {fmt_bytes(need.bytes)}",
                    f"the {backends.backend(user)} backend at {where} keeps {need.formula}; this would fail at capture",
                    f"--set resources.{r.name}.bytes={round_up(need.bytes, MiB)}, or lower that walk's budget,"
                    f" or pick a backend that needs none (fa3 on sm_90)")
            out[r.name] = Workspace(r.name, r.bytes * r.slots, users, need, declared=True)
    for r in ir.model.resources:
        if r.is_attention and getattr(r, "workspace", None) is None:
            need, _ = needs[r.name]
            # FlashInfer's wrappers take a float workspace even when they keep nothing in it
            floor = MiB if ir.target.is_gpu else 0
            out[r.name] = Workspace(r.name, round_up(max(need.bytes, floor), MiB), (r.name,), need, declared=False)
    return out
