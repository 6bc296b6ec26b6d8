"""The GPU boot: the ledger's components allocated and measured one by one, every planned graph
captured largest first into one private pool (a stream lane's graphs into a pool of their own: graphc/lanes.py),
eager steps run, all on FlashInfer's backends.

Measured per component: allocated bytes for what the runtime allocates itself, reserved-bytes
growth for the pools (capture, eager activations), device-wide used bytes for the context.
"""
from __future__ import annotations

import torch

from graphc.ir import Step
from graphc.plan import parse_graph_id
from graphc.runtime.device import DeviceBoot, allocate
from graphc.runtime.steps import layouts, synthetic_inputs
from graphc.step import TORCH_DTYPES, StepContext
from resources.flashinfer_backend import int_workspace, make_backend
from resources.linear_state import CapturedState, LinearStateSpec, StateStep


def _mem() -> tuple[int, int]:
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


def measure_context(boot: DeviceBoot) -> None:
    """CUDA context and torch init (device-wide used less what torch reserved), then cuBLAS's
    workspace, which torch takes from its own allocator on the first matmul."""
    torch.cuda.init()
    a = torch.ones(256, 256, device=boot.device)
    (a @ a).sum().item()
    del a
    free, total = torch.cuda.mem_get_info()
    allocated, reserved = _mem()
    boot.measured["context"] = (total - free) - reserved
    boot.measured["library"] = allocated
    boot.notes.append(f"device {torch.cuda.get_device_name()} total {total:,} B, torch {torch.__version__}")


def cap_memory(boot: DeviceBoot) -> None:
    """Emulate the plan's card: torch may reserve at most its capacity less what is outside torch."""
    free, total = torch.cuda.mem_get_info()
    cap = boot.plan.target.capacity_bytes
    if cap < total:
        outside = (total - free) - torch.cuda.memory_reserved()
        torch.cuda.set_per_process_memory_fraction((cap - outside) / total)
        boot.notes.append(f"capped to the plan's {cap / 2**30:.2f} GiB of {total / 2**30:.2f} GiB")


class Graphs:
    """Static buffers, backends and captured graphs of one device, in the plan's order."""

    def __init__(self, boot: DeviceBoot):
        self.boot = boot
        self.workspaces: dict[str, torch.Tensor] = {}
        self.ints: dict[str, torch.Tensor] = {}           # each resource's int workspace, its captured wrappers'
        self.io: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
        self.backends: dict[tuple[str, str, int], dict[str, object]] = {}

    # ---- allocation
    def float_workspace(self, res: str) -> torch.Tensor:
        spec = self.boot.ir.model.resource(res)
        name = getattr(spec, "workspace", None) or res
        return self.workspaces[name]

    def allocate_io(self) -> None:
        """One flat buffer per port at the family's largest rung; a rung uses a prefix of it."""
        before, _ = _mem()
        for node in self.boot.nodes:
            for family, rungs in self.boot.plan.nodes[node].graphs.items():
                step, decl = self.boot.ir.family(node, family), self.boot.ir.node(node)
                sizes = step.sizes_at(rungs[-1])
                ports = {**{f"in.{p}": decl.inputs[p] for p in step.inputs},
                         **{f"out.{p}": port for p, port in decl.outputs.items()}}
                self.io[(node, family)] = {
                    name: torch.zeros(port.nbytes(sizes) // TORCH_DTYPES[port.dtype].itemsize,
                                      dtype=TORCH_DTYPES[port.dtype], device=self.boot.device)
                    for name, port in ports.items()}
        after, _ = _mem()
        self.boot.measured["_graph_io"] = after - before

    def backend_for(self, res: str, step: Step, rung: int | None, captured: bool):
        spec = self.boot.ir.model.resource(res)
        if isinstance(spec, LinearStateSpec):       # slots, not a kernel: planned with each step's slot ids
            if not captured:
                return StateStep(self.boot.states[res])
            return CapturedState(self.boot.states[res], spec.step_shape(step.axis, step.sizes_at(rung), step.phase))
        plan_res = self.boot.plan.resources[res]
        backend = plan_res.decode_backend if step.phase == "decode" and plan_res.decode_backend else plan_res.backend
        shape = spec.step_shape(step.axis, step.sizes_at(rung), step.phase) if rung is not None else None
        ints = None
        # one int workspace per resource, shared by its captured wrappers, where the plan counts one
        if captured and any(name == "int_workspace" for name, _ in spec.wrapper_allocs(backend, shape)):
            if res not in self.ints:
                self.ints[res] = int_workspace(spec, self.boot.device)
            ints = self.ints[res]
        return make_backend(spec, backend, self.float_workspace(res), captured, shape,
                            cache=self.boot.caches.get(res), decode_backend=plan_res.decode_backend,
                            run_head_dim=plan_res.run_head_dim, ints=ints,
                            pdl=bool(self.boot.plan.nodes[step.node].kernels.get("pdl")))

    def allocate_wrappers(self) -> None:
        before, _ = _mem()
        for key in self.boot.plan.devices[self.boot.index].capture_order:
            node, family, rung = parse_graph_id(key)
            step = self.boot.ir.family(node, family)
            self.backends[(node, family, rung)] = {
                role: self.backend_for(res, step, rung, True)
                for role, res in self.boot.ir.node(node).resources.items()}
        after, _ = _mem()
        self.boot.measured["_wrappers"] = after - before

    # ---- one synthetic step
    def plan_step(self, binds: dict, step: Step, rung: int) -> None:
        kv_pages = self.boot.plan.devices[self.boot.index].kv_pages
        slots = {res: a.num_slots for res, a in self.boot.slots.items()}
        for role, (_, lay) in layouts(self.boot.ir, kv_pages, step, rung, slots).items():
            binds[role].plan(*lay.args())

    def static_inputs(self, node: str, family: str, step: Step, rung: int) -> dict[str, torch.Tensor]:
        decl, sizes, bufs = self.boot.ir.node(node), step.sizes_at(rung), self.io[(node, family)]
        fresh = synthetic_inputs(decl, step, rung, torch.device("cpu"))   # copied in: no device blocks
        out = {}
        for p in step.inputs:
            shape = decl.inputs[p].concrete(sizes)
            view = bufs[f"in.{p}"][:fresh[p].numel()].view(shape)
            view.copy_(fresh[p])
            out[p] = view
        return out

    def forward(self, node: str, family: str, step: Step, rung: int, inputs: dict) -> dict:
        binds = self.backends[(node, family, rung)]
        out = self.boot.modules[node](StepContext(binds, self.boot.reduce), **inputs)
        decl, sizes, bufs = self.boot.ir.node(node), step.sizes_at(rung), self.io[(node, family)]
        for p, port in decl.outputs.items():
            n = out[p].numel()
            bufs[f"out.{p}"][:n].view(port.concrete(sizes)).copy_(out[p])
        return out

    def _outside(self) -> int:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return (total - free) - torch.cuda.memory_reserved() - self.boot.measured["context"]

    def _note_outside(self, key: str) -> None:
        """Device memory outside torch's allocator and the context after a step of the boot (kernel
        code loaded on first launch); each growth is kept with the step that caused it."""
        outside = self._outside()
        growth = self.boot.measured.get("_outside_growth", {})
        if outside > sum(growth.values()):
            growth[key] = outside - sum(growth.values())
        self.boot.measured["_outside_growth"] = growth

    # ---- capture, largest first, into one pool (a stream lane's graphs into one of their own)
    def capture_all(self) -> None:
        order = self.boot.plan.devices[self.boot.index].capture_order
        keys = [parse_graph_id(k) for k in order]
        self.warm_eager()
        # warm-up on the current stream: lazy init and FlashInfer's first-call buffers. (A side stream
        # would get a cuBLAS workspace of its own, 32 MiB the ledger does not hold: seen on the H200.)
        with torch.inference_mode(), self.boot.phase("graph warm-up", len(keys), "graph", "run") as bar:
            for node, family, rung in keys:
                step = self.boot.ir.family(node, family)
                inputs = self.static_inputs(node, family, step, rung)
                self.plan_step(self.backends[(node, family, rung)], step, rung)
                self.forward(node, family, step, rung, inputs)
                self._note_outside(f"{node}/{family}/{rung}")
                bar.update(1)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()                    # warm-up blocks go back; the pools start empty
        lanes = self.boot.plan.devices[self.boot.index].lanes
        lane_of = {n: lane for lane, ns in lanes.items() for n in ns}
        outside_before = self._outside()
        with torch.inference_mode(), self.boot.phase("capture", len(keys), "graph", "captured") as bar:
            for comp, lane in [("capture_pool", None)] + [(f"capture_pool.{x}", x) for x in lanes]:
                self.capture_pool(comp, [k for k in keys if lane_of.get(k[0]) == lane], bar)
        # what the instantiated graphs hold outside torch's allocator (part of the kernels line)
        self.boot.measured["_graph_exec"] = self._outside() - outside_before
        for ns in lanes.values():                   # each lane's steps run on a stream of its own
            stream = torch.cuda.Stream(self.boot.device)
            self.boot.streams |= dict.fromkeys(ns, stream)

    def capture_pool(self, comp: str, keys: list[tuple[str, str, int]], bar=None) -> None:
        """Capture graphs `keys` in order into a private pool of their own, on a capture stream of their own (its
        cuBLAS workspace comes from the pool); the pool's bytes are measured as ledger line `comp`. bar: a progress
        bar, advanced a graph at a time."""
        pool = torch.cuda.graph_pool_handle()
        # a capture stream on this device: torch.cuda.graph's default one is made once per process, on the
        # device current then (another replica's GPU, where this device's work cannot be captured)
        stream = torch.cuda.Stream(self.boot.device)
        for node, family, rung in keys:
            step = self.boot.ir.family(node, family)
            inputs = self.static_inputs(node, family, step, rung)
            self.plan_step(self.backends[(node, family, rung)], step, rung)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                out = self.forward(node, family, step, rung, inputs)
            del out                            # outputs live in the static buffers, not the pool
            self.boot.graphs[f"{node}/{family}/{rung}"] = graph
            if bar is not None:
                bar.update(1)
        self.boot.measured[comp] = pool_bytes(pool)

    def replay_all(self) -> None:
        """Every captured graph replays after a re-plan, with finite outputs."""
        with torch.inference_mode():
            for key, graph in self.boot.graphs.items():
                node, family, rung = parse_graph_id(key)
                step = self.boot.ir.family(node, family)
                self.static_inputs(node, family, step, rung)
                self.plan_step(self.backends[(node, family, rung)], step, rung)
                graph.replay()
                decl = self.boot.ir.node(node)
                for p, port in decl.outputs.items():
                    buf = self.io[(node, family)][f"out.{p}"]
                    # a float32 sum is finite iff every element is, and needs no temporary the
                    # size of buf (a full device has no room for one)
                    if buf.is_floating_point() and not torch.sum(buf, dtype=torch.float32).isfinite().item():
                        raise RuntimeError(f"graph {key}: output {p} is not finite after replay")
                self.boot.ran.append(key)

    def _eager_steps(self) -> list[Step]:
        return [s for s in self.boot.steps() for w, b in self.boot.plan.nodes[s.node].buckets.items()
                if w == s.walk and b.eager_above is not None]

    def _eager_once(self, step: Step, rung: int) -> None:
        binds = {role: self.backend_for(res, step, rung, False)
                 for role, res in self.boot.ir.node(step.node).resources.items()}
        self.plan_step(binds, step, rung)
        inputs = synthetic_inputs(self.boot.ir.node(step.node), step, rung, self.boot.device)
        self.boot.modules[step.node](StepContext(binds, self.boot.reduce), **inputs)

    def warm_eager(self) -> None:
        """Each eager step at its smallest rung and at its budget, before capture (whose warm-up blocks go
        back): kernels that tune themselves on first use (Triton's autotuners: flash-linear-attention's,
        keyed partly by the step's rows) tune now, not in a served step, and their benchmark buffers are
        freed before the pools that the ledger measures grow."""
        with torch.inference_mode(), self.boot.phase("eager warm-up", len(self._eager_steps()), "step", "run") as bar:
            for step in self._eager_steps():
                rungs = self.boot.plan.nodes[step.node].buckets[step.walk].rungs
                for rung in sorted({rungs[0] if rungs else 1, step.budget}):
                    self._eager_once(step, rung)
                bar.update(1)

    def run_eager(self) -> None:
        """Each eager step once at its walk's budget: the general pool grows by what they need."""
        _, before = _mem()
        with torch.inference_mode():
            for step in self._eager_steps():
                self._eager_once(step, step.budget)
                self.boot.ran.append(f"{step.node}/{step.walk}/{step.budget} (eager)")
        _, after = _mem()
        self.boot.measured["activations"] = after - before


def pool_bytes(pool) -> int:
    """Bytes of the segments the caching allocator holds for one private (graph) pool."""
    torch.cuda.synchronize()
    return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot()
               if tuple(seg.get("segment_pool_id", (0, 0))) == tuple(pool))


def prime_convolutions(boot: DeviceBoot) -> None:
    """cuDNN chooses a convolution's engine on its first call and keeps it, but takes its first
    choice (the workspace graphc/convws.py measured) only if that workspace can be allocated then.
    Run each of the plan's convolutions once while the device is still empty, so warm-up and
    capture use the measured engines rather than fallbacks chosen under memory pressure."""
    sigs = boot.plan.devices[boot.index].conv_engines
    if not sigs:
        return
    from graphc.convws import convolution

    with boot.phase("convolutions", len(sigs), "engine", "chosen") as bar:
        for sig in sigs:
            convolution(sig, boot.device)()
            bar.update(1)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()     # the peak counts the boot, not this
    boot.notes.append(f"{len(sigs)} convolution engines chosen on an empty device")


def boot_gpu_device(boot: DeviceBoot, checkpoint: str | None, seed: int) -> DeviceBoot:
    torch.cuda.set_device(boot.device)
    measure_context(boot)
    cap_memory(boot)
    prime_convolutions(boot)
    a0, r0 = _mem()
    allocate(boot, checkpoint, seed)
    g = Graphs(boot)
    g.workspaces = {name: slots[0] for name, slots in boot.workspaces.items()}   # zeroed, as FlashInfer asks
    g.allocate_io()
    g.allocate_wrappers()
    a1, r1 = _mem()
    _split_measured(boot, a1 - a0, r1 - r0)
    g._note_outside("allocation and fill")
    g.capture_all()
    g.replay_all()
    g.run_eager()
    boot.runtime = g
    free, total = torch.cuda.mem_get_info()
    boot.measured["_device_used"] = total - free
    boot.measured["_peak_reserved"] = torch.cuda.max_memory_reserved()
    # what the device holds outside torch's allocator and the context: kernel code and graph executables
    boot.measured["kernels"] = (total - free) - boot.measured["context"] - torch.cuda.memory_reserved()
    # the peak: what lay outside torch's allocator, plus the most torch ever reserved (warm-up included)
    boot.measured["_peak_device"] = (boot.measured["context"] + boot.measured["kernels"]
                                     + boot.measured["_peak_reserved"])
    growth = sorted(boot.measured.get("_outside_growth", {}).items(), key=lambda kv: -kv[1])
    if growth:
        boot.notes.append("kernels line grew most at: " + ", ".join(f"{k} +{v / 2**20:.0f} MiB" for k, v in growth[:4]))
    return boot


def _split_measured(boot: DeviceBoot, allocated: int, reserved: int) -> None:
    """Spread the io and wrapper totals over the ledger's per-node / per-resource lines in the
    plan's proportions (torch cannot tell which node a buffer is for), and the allocator's slack."""
    m, ledger = boot.measured, boot.plan.devices[boot.index].ledger
    for prefix, total in (("graph_io.", m.pop("_graph_io", 0)), ("wrappers.", m.pop("_wrappers", 0))):
        comps = {c: b for c, b in ledger.items() if c.startswith(prefix)}
        planned = sum(comps.values()) or 1
        for c, b in comps.items():
            m[c] = round(total * b / planned)
    m["allocator"] = reserved - allocated
