"""Tally every byte one device will hold, component by component, with where each came from.

The runtime allocates in the order listed here (weight arenas, KV pools, linear-attention state slots,
workspaces, receive buffers, media caches, static graph buffers, captured wrappers' buffers), warms eager steps, then captures graphs
largest first into one private pool; the allocator model replays exactly that order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from graphc import convws, lanes as stream_lanes, media_rows, memo
from graphc.allocator import Allocator
from graphc.declare import DTYPE_BYTES
from graphc.ir import IR
from graphc.passes.choose_buckets import Buckets
from graphc.passes.select_backends import Backends
from graphc.passes.simulate_steps import Activations
from graphc.passes.size_resources import ResourceSizes
from graphc.passes.size_weights import Weights
from graphc.trace import Trace
from graphc.targets import calibration
from graphc.units import fmt_bytes
from resources.capabilities import flashinfer_modules, phases
from resources.paged_kv import PagedKVSpec

HEADROOM_FRACTION = 0.01   # default policy: keep 1% of a GPU free for what nothing here models
FLASHINFER_TRANSIENT_INT_WORKSPACE = 8 << 20


@dataclass(frozen=True)
class Item:
    component: str
    bytes: int
    source: str      # exact | formula | declared | simulated | calibrated | policy
    detail: str


@dataclass
class DeviceLedger:
    index: int
    capacity: int
    nodes: list[str]
    items: list[Item]
    kv_pages: dict[str, int]
    capture_order: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(i.bytes for i in self.items)

    @property
    def free(self) -> int:
        return self.capacity - self.total

    def get(self, component: str) -> int:
        return sum(i.bytes for i in self.items if i.component == component)


@dataclass(frozen=True)
class Sizing:
    """Everything the earlier passes computed, handed to placement and the ledger."""

    ir: IR
    backends: Backends
    buckets: Buckets
    weights: Weights
    acts: Activations
    resources: ResourceSizes
    headroom: int | None = None   # bytes; None: the default policy
    media: dict[str, int] = field(default_factory=dict)   # --set media_cache.<encoder>=rows (graphc/media_rows.py)
    lanes: dict[str, list[str]] = field(default_factory=dict)   # --set lanes.<stage>=true: lane -> nodes (graphc/lanes.py)
    # what a device's ledger takes from the above but not from its KV pages (fill_pages tallies one device
    # at many page counts): (what, nodes) -> value, filled by per_device
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)


def per_device(s: Sizing, what: str, nodes: list[str], compute):
    """compute(), once per Sizing, what and nodes: for the parts of a ledger its KV pages do not change."""
    key = (what, tuple(nodes))
    if key not in s.memo:
        s.memo[key] = compute()
    return s.memo[key]


def device_resources(s: Sizing, nodes: list[str]) -> list[str]:
    """Resources a device holds: those its nodes bind, and the workspaces those name."""
    used = []
    for n in nodes:
        for res in s.ir.node(n).resources.values():
            if res not in used:
                used.append(res)
    for res in list(used):
        ws = getattr(s.ir.model.resource(res), "workspace", None)
        if ws is not None and ws not in used:
            used.append(ws)
    return used


def persistent_allocs(s: Sizing, nodes: list[str], kv_pages: dict[str, int]) -> list[tuple[str, str, int, str]]:
    """(component, buffer, bytes, source) in the runtime's allocation order."""
    out = []
    for n in nodes:
        out.append((f"weights.{n}", "arena", s.weights.per_node[n].arena, "exact"))
    for res in device_resources(s, nodes):
        spec = s.ir.model.resource(res)
        if isinstance(spec, PagedKVSpec) and kv_pages.get(res):
            out.append((f"kv.{res}", "pool", kv_pages[res] * spec.page_bytes, "exact"))
        state = s.resources.state.get(res)
        if state is not None:
            out += [(f"state.{label}", "slots", sized.bytes, "exact") for label, sized in spec.lines(state.slots)]
        ws = s.resources.workspaces.get(res)
        if ws is not None and ws.bytes:
            slots = getattr(spec, "slots", 1)
            src = "declared" if ws.declared else "formula"
            out += [(f"workspace.{res}", f"slot{i}", ws.bytes // slots, src) for i in range(slots)]
    for src, port, numel, dtype in s.ir.transfers_into(nodes):       # what other devices send this one
        out.append((f"transfers.{src}", port, numel * DTYPE_BYTES[dtype], "exact"))
    out += media_cache_allocs(s, nodes)
    for (n, fam), bufs in s.acts.io.items():
        if n in nodes:
            out += [(f"graph_io.{n}", f"{fam}.{b}", size, "exact") for b, size in bufs]
    for key, bufs in s.resources.wrappers.items():
        if key[0] in nodes:
            out += [(f"wrappers.{res}", f"{key[1]}@{key[2]}.{b}", size, "formula") for res, b, size in bufs]
    return out


def media_cache_allocs(s: Sizing, nodes: list[str]) -> list[tuple[str, str, int, str]]:
    """The row caches on the LLM's device: a buffer of each read port of each cached node (graphc/media_rows.py)."""
    model = s.ir.model
    if media_rows.llm_of(model) not in nodes:
        return []
    out = []
    for enc in media_rows.cached(model):
        rows, _ = media_rows.planned_rows(s.ir, enc, s.media)
        if rows:
            out += [(f"media_cache.{enc}", p.port, rows * p.row_bytes, "policy") for p in media_rows.row_ports(model, enc)]
    return out


def capture_order(s: Sizing, nodes: list[str]) -> list[tuple[str, str, int]]:
    """Largest simulated peak first, so later, smaller graphs reuse the pool's freed blocks."""
    keys = [k for k in s.acts.graphs if k[0] in nodes]
    return sorted(keys, key=lambda k: (-s.acts.graphs[k][1].peak_bytes, k[0], k[1], -k[2]))


_POOLS: dict[tuple, int] = memo.table("tally_ledger.pools")
_GENERAL: dict[tuple, tuple[int, int]] = memo.table("tally_ledger.general")


def capture_pool_bytes(traces: list[Trace], stream_workspace: int = 0) -> int:
    """Reserved bytes of one private pool after capturing these traces in order (memoized by the
    traces' content). The capture stream's own cuBLAS workspace is taken from the pool at the first
    captured matmul."""
    key = (tuple(t.digest for t in traces), stream_workspace)
    if key not in _POOLS:
        pool = Allocator()
        if traces and stream_workspace:
            pool.malloc("cublas", stream_workspace)
        for i, t in enumerate(traces):
            pool.replay(t.events, tag=i)
        _POOLS[key] = pool.reserved
    return _POOLS[key]


def general_pool_bytes(sizes: list[int], eager: list[Trace], cached: int = 0) -> tuple[int, int]:
    """(reserved after the persistent allocations, reserved after the eager steps too), memoized.
    `cached`: a block freed but kept by the allocator before the eager steps (FlashInfer's)."""
    key = (tuple(sizes), tuple(t.digest for t in eager), cached)
    if key not in _GENERAL:
        general = Allocator()
        for i, size in enumerate(sizes):
            general.malloc(("persistent", i), size)
        if cached:
            general.malloc("cached", cached)
        persistent = general.reserved
        for i, t in enumerate(eager):
            general.replay(t.events, tag=i)
        _GENERAL[key] = (persistent, general.reserved)
    return _GENERAL[key]


def headroom_bytes(s: Sizing) -> int:
    if s.headroom is not None:
        return s.headroom
    return int(s.ir.target.memory_bytes * HEADROOM_FRACTION) if s.ir.target.is_gpu else 0


def overhead_bytes(s: Sizing, nodes: list[str]) -> int:
    """What a device holds besides its allocations: the calibrated lines and the headroom."""
    if not s.ir.target.is_gpu:
        return headroom_bytes(s)
    cal = calibration(s.ir.target)
    return cal.context_bytes + cal.library_bytes + kernels_bytes(s, nodes) + headroom_bytes(s)


def graph_launches(s: Sizing, nodes: list[str]) -> tuple[int, int]:
    """(graphs, kernel launches in them) the device captures, from the simulation's traces."""
    traces = [t for (node, _, _), (_, t) in s.acts.graphs.items() if node in nodes] if s.ir.target.capture else []
    return len(traces), sum(t.launches for t in traces)


def kernels_bytes(s: Sizing, nodes: list[str]) -> int:
    """Device memory outside torch's allocator besides the context: kernel code and the driver's
    reserves after the first launches (a calibrated constant), plus the instantiated CUDA graphs,
    which hold memory per kernel launch (calibrated bytes per launch x the simulated launches)."""
    cal = calibration(s.ir.target)
    return cal.kernels_base_bytes + graph_launches(s, nodes)[1] * cal.graph_launch_bytes


def kernel_modules(s: Sizing, nodes: list[str]) -> list[str]:
    """The FlashInfer JIT modules a device loads (resources.capabilities.flashinfer_modules)."""
    mods = set()
    for res in device_resources(s, nodes):
        spec = s.ir.model.resource(res)
        c = s.backends.chosen.get(res)
        if c is None or c.prefill == "torch" or not spec.is_attention:
            continue
        for phase, backend in phases(spec, c.prefill, c.decode):
            mods.update(flashinfer_modules(spec, phase, backend, c.head_dim))
    return sorted(mods)


def device_convs(s: Sizing, nodes: list[str]) -> list[str]:
    """The signatures of the convolutions a GPU device's steps run (graphc/convws.py): the plan
    lists them, and the runtime runs each once on the empty device."""
    if not s.ir.target.is_gpu:
        return []
    traces = [t for (n, _, _), (_, t) in s.acts.graphs.items() if n in nodes]
    traces += [t for (n, _), t in s.acts.eager.items() if n in nodes]
    return sorted({sig for t in traces for _, sig in t.convs})


def _conv_note(s: Sizing, nodes: list[str]) -> str:
    """Where the traces' convolution workspaces came from, and which have none measured."""
    convs = set(device_convs(s, nodes))
    if not convs:
        return ""
    missing = convs & s.acts.uncalibrated
    text = f"; cuDNN workspaces of {len(convs) - len(missing)} convolution signatures, {convws.source(s.ir.target.arch)}"
    if missing:
        text += (f"; {len(missing)} signatures have no measured workspace and count as none: measure them with "
                 "examples/tools/calibrate_convs.py on the target")
    return text


def pool_items(s: Sizing, nodes: list[str], order: list[tuple[str, str, int]], workspace: int) -> list[Item]:
    """The device's capture pools: `capture_pool` for the graphs of the main stream, and `capture_pool.<lane>`
    for each stream lane's (graphc/lanes.py), each captured largest first into a pool of its own on a capture
    stream of its own (whose cuBLAS workspace, `workspace` bytes, the pool holds)."""
    lanes = stream_lanes.on_device(s.lanes, nodes)
    inside = {n for ns in lanes.values() for n in ns}
    groups = [("capture_pool", [k for k in order if k[0] not in inside], "")]
    groups += [(f"capture_pool.{name}", [k for k in order if k[0] in ns], f" of lane {name} ({', '.join(ns)}), "
                "on a stream of its own,") for name, ns in lanes.items()]
    items = []
    for comp, keys, where in groups:
        size = per_device(s, comp, nodes, lambda keys=keys: capture_pool_bytes([s.acts.graphs[k][1] for k in keys],
                                                                              workspace))
        text = (f"{len(keys)} graphs{where} captured largest first into "
                + ("one pool" if not lanes else "a pool of their own") + "; allocator model of their traces"
                + (f", plus the capture stream's cuBLAS workspace ({workspace:,} B, calibrated)" if keys else ""))
        if comp == "capture_pool":
            text += per_device(s, "convs", nodes, lambda: _conv_note(s, nodes))
        items.append(Item(comp, size, "simulated", text))
    return items


def tally_ledger(s: Sizing, index: int, nodes: list[str], kv_pages: dict[str, int]) -> DeviceLedger:
    target = s.ir.target
    allocs = persistent_allocs(s, nodes, kv_pages)
    items: dict[str, list] = {}
    for comp, buf, size, source in allocs:
        items.setdefault(comp, [0, source, 0])
        items[comp][0] += size
        items[comp][2] += 1
    ledger = [Item(c, b, src, _detail(s, c, b, n, kv_pages, nodes)) for c, (b, src, n) in items.items()]
    eager = sorted((k for k in s.acts.eager if k[0] in nodes), key=lambda k: -s.acts.eager[k].peak_bytes)
    order = per_device(s, "order", nodes, lambda: capture_order(s, nodes) if target.capture else [])
    if target.is_gpu:
        cal = calibration(target)
        wrappers = any(c.startswith("wrappers.") for c, *_ in allocs)
        # each FlashInfer wrapper is built with an 8 MiB int workspace that ours replaces; the freed
        # block stays cached and the next wrapper's reuses it (seen on the H200: one per device)
        transient = FLASHINFER_TRANSIENT_INT_WORKSPACE if wrappers else 0
        persistent_reserved, general_reserved = general_pool_bytes([a[2] for a in allocs],
                                                                   [s.acts.eager[k] for k in eager], transient)
        raw = sum(a[2] for a in allocs)
        modules = per_device(s, "modules", nodes, lambda: kernel_modules(s, nodes))
        graphs, launches = per_device(s, "launches", nodes, lambda: graph_launches(s, nodes))
        ledger += pool_items(s, nodes, order, cal.library_bytes) + [
            Item("activations", general_reserved - persistent_reserved, "simulated",
                 f"{len(eager)} eager step(s) at their budgets: " + ", ".join(f"{n}@{w}" for n, w in eager)
                 if eager else "no eager steps"),
            Item("allocator", persistent_reserved - raw, "simulated",
                 f"caching-allocator rounding and segment tails of {len(allocs)} persistent allocations"
                 + (", and FlashInfer's replaced 8 MiB int workspace, kept cached" if transient else "")),
            Item("context", cal.context_bytes, "calibrated", f"CUDA context and torch init; {cal.source}"),
            Item("library", cal.library_bytes, "calibrated", f"cuBLAS workspace; {cal.source}"),
            Item("kernels", per_device(s, "kernels", nodes, lambda: kernels_bytes(s, nodes)), "calibrated",
                 f"kernel code and driver reserves {cal.kernels_base_bytes:,} B (with {len(modules)} FlashInfer "
                 f"modules: {', '.join(modules) or 'none'}) + {graphs} CUDA graphs holding {launches:,} simulated "
                 f"kernel launches x {cal.graph_launch_bytes:,} B; {cal.kernels_source}"),
        ]
    else:
        peak = max((s.acts.eager[k].peak_bytes for k in eager), default=0)
        ledger.append(Item("activations", peak, "simulated",
                           f"largest eager step's live bytes ({len(eager)} eager steps)"))
    ledger.append(Item("headroom", headroom_bytes(s), "policy",
                       "--headroom" if s.headroom is not None else
                       f"default: {HEADROOM_FRACTION:.0%} of the device kept free" if target.is_gpu else "none on cpu"))
    return DeviceLedger(index, target.memory_bytes, list(nodes), ledger, dict(kv_pages), order)


def _detail(s: Sizing, comp: str, nbytes: int, count: int, kv_pages: dict[str, int], nodes: list[str]) -> str:
    kind, _, name = comp.partition(".")
    if kind == "weights":
        w = s.weights.per_node[name]
        return (f"{w.num_params:,} params = {w.params:,} B, buffers {w.buffers:,} B, in one arena of {w.num_tensors}"
                f" tensors aligned to 256 B")
    if kind == "kv":
        spec = s.ir.model.resource(name)
        return f"{kv_pages[name]} pages x {spec.page_bytes:,} B ({spec.page_formula()})"
    if kind == "state":
        res = name.split(".")[0]
        state = s.resources.state[res]
        return f"{dict(s.ir.model.resource(res).lines(state.slots))[name].formula}; {state.slots} slots: {state.why}"
    if kind == "workspace":
        ws = s.resources.workspaces[name]
        src = "declared" if ws.declared else "sized by formula"
        return f"{src}: {fmt_bytes(ws.bytes)}; largest need {fmt_bytes(ws.need.bytes)} = {ws.need.formula}"
    if kind == "transfers":
        bufs = [(port, n, dt) for src, port, n, dt in s.ir.transfers_into(nodes) if src == name]
        return (f"receive buffers of {name}'s output(s) sent from its device: "
                + "; ".join(f"{p} {n:,} x {dt}" for p, n, dt in bufs) + " (largest step of its walks)")
    if kind == "media_cache":
        rows, why = media_rows.planned_rows(s.ir, name, s.media)
        ports = media_rows.row_ports(s.ir.model, name)
        return (f"{rows:,} rows of {name}'s output x {sum(p.row_bytes for p in ports):,} B a row ("
                + " + ".join(f"{p.port} {list(p.row_shape)} x {p.dtype}" for p in ports)
                + f") on the LLM's device; rows: {why}")
    if kind == "graph_io":
        return f"{count} static input/output buffers at each captured family's largest rung"
    if kind == "wrappers":
        c = s.backends.chosen.get(name) if s.ir.model.resource(name).is_attention else None
        used = f"{c.prefill}/{c.decode} wrappers" if c and c.decode != c.prefill else (
            f"{c.prefill} wrappers" if c else "state bindings")
        kinds = sorted({buf for bufs in s.resources.wrappers.values() for res, buf, _ in bufs if res == name})
        return f"{count} fixed buffers of captured {used} ({', '.join(kinds)})"
    return ""
