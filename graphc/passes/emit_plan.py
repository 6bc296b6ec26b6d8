"""Write the Plan: placement, ledgers with their sources, buckets, backends, walks, requests."""
from __future__ import annotations

import sys

from graphc import lanes as stream_lanes, memo
from graphc.modules import node_key, set_kernels
from graphc.plan import FORMAT, Plan, PlanDevice, PlanModel, PlanNode, PlanResource, PlanTarget, PlanTrim, \
    PlanWalk, PlanWalkBuckets, fingerprint
from graphc.passes.place_nodes import Placement
from graphc.passes.simulate_steps import fake_node
from graphc.passes.size_host import size_host
from graphc.passes.tally_ledger import Sizing, device_convs
from graphc.units import fmt_bytes
from resources.paged_kv import PagedKVSpec

VERSION = "0.1.0"


def graph_id(key: tuple[str, str, int]) -> str:
    return f"{key[0]}/{key[1]}/{key[2]}"


_DECLARED: dict[tuple, tuple[str, ...]] = memo.table("emit_plan.knobs")


def _kernels(node, knobs: dict[str, int]) -> dict[str, int]:
    """The node's kernel choices, where its modules declare the knobs (recorded only where they act).
    Which knobs a node's modules declare is kept in the disk cache: a plan from cached traces builds no
    module."""
    if not knobs:
        return {}
    key = node_key(node)
    if key not in _DECLARED:
        _DECLARED[key] = tuple(sorted(set_kernels(fake_node(node).module, {})))
    return {k: v for k, v in knobs.items() if k in _DECLARED[key]}


def emit_plan(s: Sizing, placement: Placement, source: dict, overrides: dict, trimmed: list, replicas: int = 1,
              layout_why: str = "", tp: int = 1) -> Plan:
    """replicas: copies of the placed devices, each served alone (graphc/passes/choose_layout.py); tp: the
    tensor-parallel ranks of one rank's plan (its one device's ledger is every rank's); layout_why: why that
    layout, on more than one device."""
    ir, a = s.ir, placement.assignment
    devices = []
    for d in placement.devices:
        host = size_host(s, d.nodes)
        devices.append(PlanDevice(index=d.index, nodes=d.nodes, ledger={i.component: i.bytes for i in d.items},
                                  sources={i.component: f"{i.source}: {i.detail}" for i in d.items},
                                  total_bytes=d.total, capacity_bytes=d.capacity, free_bytes=d.free,
                                  kv_pages=d.kv_pages, capture_order=[graph_id(k) for k in d.capture_order],
                                  conv_engines=device_convs(s, d.nodes), host={i.component: i.bytes for i in host},
                                  host_sources={i.component: f"{i.source}: {i.detail}" for i in host},
                                  lanes=stream_lanes.on_device(s.lanes, d.nodes)))
    nodes = {}
    for n in ir.model.nodes:
        w = s.weights.per_node[n.name]
        buckets = {}
        for st in ir.steps_of(n.name):
            cap = s.buckets.captured.get((n.name, st.family), [])
            rungs = s.buckets.walk_rungs[(n.name, st.walk)]
            buckets[st.walk] = PlanWalkBuckets(axis=st.axis, budget=st.budget, rungs=rungs,
                                               captured=[r for r in rungs if r in cap],
                                               eager_above=max([r for r in rungs if r in cap], default=0)
                                               if (n.name, st.walk) in s.buckets.eager else None,
                                               why=s.buckets.why[(n.name, st.walk)])
        nodes[n.name] = PlanNode(device=a[n.name], module=n.module_name,
                                 dtype=n.dtype, weights_bytes=w.params, num_params=w.num_params, arena_bytes=w.arena,
                                 resources=dict(n.resources), buckets=buckets,
                                 graphs={fam: rs for (nn, fam), rs in s.buckets.captured.items() if nn == n.name},
                                 kernels=_kernels(n, s.backends.kernels.get(n.name, {})))
    resources = _resources(s, placement)
    walks = {w.name: PlanWalk(kind=w.kind, path=list(w.path), budget=w.budget.axes(), capture=w.capture)
             for w in ir.model.walks}
    requests = {r.name: [st if isinstance(st, str) else list(st) for st in r.stages] for r in ir.model.requests}
    target = PlanTarget(gpu=ir.target.name, count=replicas * tp * ir.num_devices, arch=ir.target.arch,
                        capacity_bytes=ir.target.memory_bytes, memory_source=ir.target.memory_source,
                        num_sms=ir.target.num_sms, host_bytes=ir.target.host_bytes)
    body = dict(format=FORMAT, model=PlanModel(**source), target=target,
                versions={"graphc": VERSION, "torch": memo.torch_version().split("+")[0],
                          "python": f"{sys.version_info.major}.{sys.version_info.minor}"},
                overrides=overrides, trimmed=[PlanTrim(change=t.change, freed_bytes=t.freed, why=t.why) for t in trimmed],
                replicas=replicas, tensor_parallel=tp, placement=f"{layout_why}; within the copy: {placement.why}" if layout_why
                else placement.why, devices=devices, nodes=nodes, resources=resources, walks=walks,
                requests=requests, pipeline=ir.model.pipeline)
    draft = Plan(**body, fingerprint="")
    return draft.model_copy(update={"fingerprint": fingerprint(draft.body())})


def _resources(s: Sizing, placement: Placement) -> dict[str, PlanResource]:
    """Each resource: its kind, backend, devices and bytes, and why (pages, slots, workspaces)."""
    ir, a = s.ir, placement.assignment
    resources = {}
    for r in ir.model.resources:
        users = ir.users.get(r.name, [])
        devs = sorted({a[u] for u, _ in users} | {a[u] for o in ir.model.resources
                                                   if getattr(o, "workspace", None) == r.name
                                                   for u, _ in ir.users.get(o.name, [])})
        c = s.backends.chosen.get(r.name)
        entry = dict(kind=r.kind, backend=c.prefill if c else None, devices=devs, bytes=0,
                     why=c.why if c else "", workspace=getattr(r, "workspace", None),
                     decode_backend=c.decode if c and isinstance(r, PagedKVSpec) else None,
                     run_head_dim=c.head_dim if c and c.head_dim != getattr(r, "head_dim", None) else None)
        if isinstance(r, PagedKVSpec):
            pages = {d.index: d.kv_pages[r.name] for d in placement.devices if r.name in d.kv_pages}
            entry.update(pages=pages, page_bytes=r.page_bytes, max_seq_len=r.max_seq_len, min_pages=r.min_pages,
                         bytes=sum(p * r.page_bytes for p in pages.values()))
            if r.pages is None:
                entry["why"] += _fill_note(placement, devs)
        slots = s.resources.state.get(r.name)
        if slots is not None:
            entry.update(slots=slots.slots, slot_bytes=r.slot_bytes, bytes=r.bytes_for(slots.slots),   # its node's device
                         why=f"state slots: {slots.why}; delta rule: {entry['why']}")
        ws = s.resources.workspaces.get(r.name)
        if ws is not None:
            entry["bytes"] += ws.bytes * len(devs)
            entry["why"] = (entry["why"] + "; " if entry["why"] else "") + f"float workspace need: {ws.need.formula}"
        resources[r.name] = PlanResource(**entry)
    return resources


def _fill_note(placement: Placement, devs: list[int]) -> str:
    """Why a fill pool holds its pages: what its devices have left, after state slots among the rest."""
    state = {d.index: sum(i.bytes for i in d.items if i.component.startswith("state.")) for d in placement.devices
             if d.index in devs}
    held = [f"{fmt_bytes(b)} on device {i}" for i, b in state.items() if b]
    if not held:
        return ""
    return (f"; its pages fill what each device has left after the other lines of its ledger, linear-attention "
            f"state slots among them ({', '.join(held)}): fewer decode sequences hold fewer slots and leave more pages")
