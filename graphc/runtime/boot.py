"""Boot a plan on its device(s): check it is the plan's, build nodes, load or fill weights, allocate
KV pools, workspaces and static buffers in the ledger's order, warm up, capture every planned graph
largest first into one pool, and measure each ledger component as it is created.

CPU plans boot too: nothing is captured, and every rung of every walk runs once eagerly. A CPU has
no device memory counters, so its boot measures the storages its tensors really live in (weights,
KV caches the steps wrote into, workspaces) and each step's live op-output bytes.
"""
from __future__ import annotations

import gc
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from graphc.errors import InvalidInput
from graphc.ir import IR, Step
from graphc.overrides import apply_overrides
from graphc.plan import Plan, file_sha256
from graphc.runtime.device import DeviceBoot, allocate, sum_over_ranks
from graphc.runtime.progress import BootProgress
from graphc.runtime.steps import layouts, synthetic_inputs
from graphc.source import load_model
from graphc.step import StepContext
from graphc.targets import get_target
from graphc.verify import verify_graph
from resources.linear_state import LinearStateSpec, StateStep
from resources.paged_kv import PagedTorch
from resources.ragged_attention import RaggedAttentionSpec, RaggedTorch

GPU_NAMES = {"H100": "h100", "H200": "h200", "A100-SXM4-80GB": "a100-80gb", "A100-SXM4-40GB": "a100-40gb",
             "L40S": "l40s", "B200": "b200", "B300": "b300"}


def check_plan_source(plan: Plan, force: bool) -> None:
    path = Path(plan.model.file)
    if not path.is_file():
        raise InvalidInput(f"the plan's model file {plan.model.file} is not here", "boot rebuilds nodes from it",
                           "run from the directory the plan was compiled in")
    now = file_sha256(path)
    if now != plan.model.sha256 and not force:
        raise InvalidInput(f"{plan.model.file} changed since the plan was compiled",
                           f"plan sha256 {plan.model.sha256[:12]}, file now {now[:12]}",
                           "regenerate the plan (graphc plan ...), or pass --force to boot it anyway")


def local_gpu() -> tuple[str | None, str, int]:
    """(catalog name or None, arch, total bytes) of cuda:0."""
    props = torch.cuda.get_device_properties(0)
    name = next((v for k, v in GPU_NAMES.items() if k in props.name), None)
    return name, f"sm_{props.major}{props.minor}", props.total_memory


def check_target(plan: Plan, emulate: bool, force: bool) -> torch.device:
    if plan.target.arch == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InvalidInput(f"the plan targets {plan.target.gpu} and this machine has no CUDA device",
                           "", "boot it on the GPU the plan names, or plan for --gpu cpu")
    name, arch, total = local_gpu()
    if arch != plan.target.arch and not force:
        raise InvalidInput(f"the plan targets {plan.target.gpu} ({plan.target.arch}); this GPU is {arch}",
                           "its kernels and capability table differ", "plan for this GPU, or pass --force")
    if name != plan.target.gpu and not (emulate or force):
        raise InvalidInput(f"the plan targets {plan.target.gpu}; this GPU is {name or 'unknown'}",
                           "a plan is a promise for one card", "plan for this GPU, or pass --emulate to cap "
                           "this one to the plan's memory (same arch only)")
    if plan.target.capacity_bytes > total:
        need = plan.target.capacity_bytes
        raise InvalidInput(f"the plan needs a {need:,} B ({need / 2**30:.3f} GiB) device; this one has {total:,} B "
                           f"({total / 2**30:.3f} GiB), {need - total:,} B short", "the ledger fills the plan's card",
                           "plan for this card: graphc plan MODEL --gpu NAME --memory-cap "
                           f"{total / 2**30:.3f}GiB (or a catalog card this one matches)")
    return torch.device("cuda", 0)


def plan_ir(plan: Plan) -> IR:
    return _plan_ir(plan)[0]


def _plan_ir(plan: Plan) -> tuple[IR, object]:
    """The plan's IR, and the model file's module it was declared by."""
    src = load_model(plan.model.file, plan.model.preset, plan.model.config, tp=plan.tensor_parallel)
    model = apply_overrides(src.model, plan.overrides)
    t = plan.target
    whole = t.host_bytes if t.host_bytes is not None else t.capacity_bytes
    cap = None if whole == get_target(t.gpu).budget_bytes() else whole
    # the host's budget is split over every device of every replica and rank; the IR is one replica's (one rank's)
    return verify_graph(model, get_target(t.gpu, cap, t.count), len(plan.devices)), src.module


def torch_binding(boot: DeviceBoot, spec, args: tuple):
    """A resource's torch binding for one step on this device: its layout's args over the booted pools."""
    if isinstance(spec, RaggedAttentionSpec):
        return RaggedTorch(spec, *args)
    if isinstance(spec, LinearStateSpec):
        return StateStep(boot.states[spec.name], *args)
    return PagedTorch(spec, boot.caches[spec.name], *args)


class Binder:
    """Resource bindings for one synthetic step on the CPU: the torch backends (runtime/gpu.py plans
    FlashInfer's with the same layouts)."""

    def __init__(self, boot: DeviceBoot):
        self.boot = boot
        self.kv: dict[str, list[torch.Tensor]] = {}     # resource -> the caches steps were bound to

    def bind(self, step: Step, rung: int) -> dict:
        kv_pages = self.boot.plan.devices[self.boot.index].kv_pages
        slots = {res: a.num_slots for res, a in self.boot.slots.items()}
        out = {role: torch_binding(self.boot, spec, lay.args())
               for role, (spec, lay) in layouts(self.boot.ir, kv_pages, step, rung, slots).items()}
        for b in out.values():
            if isinstance(b, PagedTorch):
                self.kv.setdefault(b.spec.name, []).append(b.cache)
        return out


class LiveBytes(TorchDispatchMode):
    """Peak bytes of the storages ops create during a step that are alive at once: the step's
    activations as the CPU kernels allocate them. An op's output storage that none of its inputs
    had is new (so views and in-place writes into weights, caches and inputs are not); its
    death is a free. Scratch a kernel allocates and frees inside itself is not seen."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.alive: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # torch.tensor(data) fills its storage outside dispatch and shows it first to lift_fresh
        fresh = func is torch.ops.aten.lift_fresh.default
        inputs = set() if fresh else {id(t.untyped_storage()) for t in tree_leaves((args, kwargs))
                                      if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                if id(s) not in inputs and id(s) not in self.alive and s.nbytes():
                    self._born(s)
        return out

    def _born(self, storage) -> None:
        sid, n = id(storage), storage.nbytes()
        self.live += n
        self.peak = max(self.peak, self.live)

        def died(_ref, sid=sid, n=n):
            self.alive.pop(sid, None)
            self.live -= n
        self.alive[sid] = weakref.ref(storage, died)


def run_step(module: torch.nn.Module, ctx: StepContext, inputs: dict) -> tuple[dict, int]:
    """The step's outputs and its peak live bytes. The cyclic collector is off so that tensors die
    in refcount order, as the plan's simulation assumes."""
    rec, collecting = LiveBytes(), gc.isenabled()
    gc.disable()
    try:
        with rec:
            out = module(ctx, **inputs)
    finally:
        if collecting:
            gc.enable()
    return out, rec.peak


def run_every_rung(boot: DeviceBoot) -> Binder:
    """Eagerly run one synthetic step of every walk at every rung (the CPU boot's check)."""
    binder = Binder(boot)
    todo = [(s, r) for s in boot.steps() for r in boot.plan.nodes[s.node].buckets[s.walk].rungs]
    with boot.phase("warm-up", len(todo), "step", "run") as bar, torch.inference_mode():
        for step, rung in todo:
            node = boot.ir.node(step.node)
            inputs = synthetic_inputs(node, step, rung, boot.device)
            out, peak = run_step(boot.modules[step.node], StepContext(binder.bind(step, rung), boot.reduce), inputs)
            sizes = step.sizes_at(rung)
            for name, port in node.outputs.items():
                if tuple(out[name].shape) != port.concrete(sizes):
                    raise RuntimeError(f"{step.node} on {step.walk} at {rung}: output {name} is "
                                       f"{list(out[name].shape)}, planned {list(port.concrete(sizes))}")
                if out[name].is_floating_point() and not torch.isfinite(out[name]).all():
                    raise RuntimeError(f"{step.node} on {step.walk} at {rung}: output {name} is not finite")
            boot.ran.append(f"{step.node}/{step.walk}/{rung}")
            boot.step_peaks[boot.ran[-1]] = peak
            bar.update(1)
    return binder


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, end) byte addresses of a tensor's elements."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages the tensors live in."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def check_arena(boot: DeviceBoot, name: str) -> None:
    """Every parameter and buffer of the node on the device, inside its arena, none overlapping."""
    arena, module = boot.arenas[name], boot.modules[name]
    lo, hi = _span(arena)
    spans = []
    for tname, t in [*module.named_parameters(), *module.named_buffers()]:
        a, e = _span(t)
        if t.device != boot.device or not lo <= a <= e <= hi:
            boot.faults.append(f"weights.{name}: {tname} ({t.numel() * t.element_size():,} B on {t.device}) "
                               f"is not in the node's {hi - lo:,} B arena")
        elif e > a:
            spans.append((a, e, tname))
    spans.sort()
    overlaps = [(cur, prev) for (_, end, prev), (start, _, cur) in zip(spans, spans[1:]) if start < end]
    if overlaps:
        boot.faults.append(f"weights.{name}: {len(overlaps)} tensor(s) overlap the one before them in the arena, "
                           f"first {overlaps[0][0]} over {overlaps[0][1]}")


def measure_storages(boot: DeviceBoot, binder: Binder) -> None:
    """Measured weights, KV and workspaces of a CPU boot: the bytes of the storages the modules'
    tensors, the caches the steps were bound to and the workspaces really live in, read back from
    torch rather than from the formulas that sized them (the plan's own), so a tensor outside its
    arena, an arena or cache of another size, or a pool no step wrote into shows as a difference."""
    for name, module in boot.modules.items():
        check_arena(boot, name)
        tensors = [t for t in [*module.parameters(), *module.buffers()] if t.device == boot.device]
        boot.measured[f"weights.{name}"] = _storage_bytes(tensors)
    for res in boot.caches:
        boot.measured[f"kv.{res}"] = _storage_bytes(binder.kv.get(res, []))
    for name, slots in boot.workspaces.items():
        boot.measured[f"workspace.{name}"] = _storage_bytes(slots)


def boot_plan(plan: Plan, devices: list[int] | None = None, checkpoint: str | None = None, seed: int = 0,
              emulate: bool = False, force: bool = False, prebuild: bool = True,
              gpu: int | None = None, progress: BootProgress | None = None, rank: int = 0) -> list[DeviceBoot]:
    """gpu: the CUDA device to boot on (cuda:0 unless given; a multi-device plan's engine boots its own
    device on the GPU of that index, its workers see one GPU each). progress: where the boot's phases are
    reported (graphc/runtime/progress.py); without one, a BootProgress of this boot's own, which also
    reports the boot's end. rank: which tensor-parallel rank's weights to load; a plan of several ranks boots
    in a process that joined their process group, every rank at once (its steps sum over the ranks)."""
    own = progress is None
    progress = BootProgress() if own else progress
    check_plan_source(plan, force)
    device = check_target(plan, emulate, force)
    if device.type == "cuda" and gpu is not None:
        device = torch.device("cuda", gpu)
    ir, module = _plan_ir(plan)
    wanted = devices if devices is not None else list(range(len(plan.devices)))
    for d in wanted:
        if not 0 <= d < len(plan.devices):
            raise InvalidInput(f"device {d} is not in the plan", f"it has devices 0..{len(plan.devices) - 1}")
    reduce = sum_over_ranks if plan.tensor_parallel > 1 else None
    boots = [DeviceBoot(plan, d, device, ir, module=module, progress=progress, rank=rank, reduce=reduce)
             for d in wanted]
    if device.type == "cuda":
        _boot_gpu(boots, checkpoint, seed, prebuild)
    else:
        for boot in boots:
            allocate(boot, checkpoint, seed)
            measure_storages(boot, run_every_rung(boot))
    if own:
        progress.done()
    return boots


def _boot_gpu(boots: list[DeviceBoot], checkpoint: str | None, seed: int, prebuild: bool) -> None:
    from graphc.runtime.gpu import boot_gpu_device
    from graphc.runtime.kernels import kernel_jobs, warm

    if not boots:
        return
    first = boots[0]
    # before this process touches the device: the children's contexts are gone when it measures
    jobs = kernel_jobs(first.plan, first.ir, [b.index for b in boots]) if prebuild else []
    built = warm(jobs, gpu=first.device.index or 0, progress=first.progress)
    for boot in boots:
        if built:
            boot.notes.append(f"{len(built)} kernel jobs built or loaded in parallel in "
                              f"{max(built.values()):.0f} s")
        boot_gpu_device(boot, checkpoint, seed)
