"""One plan device as its boot fills it in (DeviceBoot), and its allocation: weights, KV pools, workspaces,
the buffers other devices' outputs arrive in and the media caches, in the ledger's order. The CPU boot (boot.py) and the GPU boot
(gpu.py) both allocate through it and then measure what it holds, each its own way."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from graphc.errors import InvalidInput
from graphc.ir import IR, Step
from graphc.modules import arrange_weights, set_kernels
from graphc.plan import Plan
from graphc.runtime.build import fill_seeded, materialize
from graphc.runtime.checkpoint import Shards, load_weights
from graphc.runtime.media_cache import allocate_caches
from graphc.runtime.progress import BootProgress
from graphc.step import TORCH_DTYPES
from resources.linear_state import LinearState, SlotAllocator, new_state
from resources.paged_kv import PageAllocator, new_cache
from resources.workspace import WorkspaceSpec


@dataclass
class DeviceBoot:
    """One plan device, booted: what it holds and what was measured."""

    plan: Plan
    index: int
    device: torch.device
    ir: IR
    modules: dict[str, torch.nn.Module] = field(default_factory=dict)
    arenas: dict[str, torch.Tensor] = field(default_factory=dict)
    caches: dict[str, torch.Tensor] = field(default_factory=dict)
    pages: dict[str, PageAllocator] = field(default_factory=dict)
    states: dict[str, LinearState] = field(default_factory=dict)       # linear_state resources' slot tensors
    slots: dict[str, SlotAllocator] = field(default_factory=dict)
    workspaces: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    transfers: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)   # (node, port) sent here
    media: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)   # cached node -> port -> its rows (media_rows)
    measured: dict[str, int] = field(default_factory=dict)
    graphs: dict[str, object] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)             # CPU: storages that break the arena layout
    step_peaks: dict[str, int] = field(default_factory=dict)    # CPU: step -> peak live op-output bytes
    runtime: object = None                                      # GPU: the boot's gpu.Graphs, which serving replays
    module: object = None                                       # the imported model file (its host() serves it)
    progress: BootProgress = field(default_factory=BootProgress)   # where its phases are reported
    rank: int = 0                                               # its tensor-parallel rank (plan.tensor_parallel)
    streams: dict[str, object] = field(default_factory=dict)    # GPU: node -> the CUDA stream of its lane (plan lanes)
    reduce: Callable | None = None                              # StepContext.reduce of its nodes (ranks > 1)

    @property
    def nodes(self) -> list[str]:
        return self.plan.devices[self.index].nodes

    def steps(self) -> list[Step]:
        return [s for s in self.ir.steps if s.node in self.nodes]

    def phase(self, name: str, total: float | None, unit: str, verb: str):
        """A phase of this device's boot (BootProgress.phase), named with the device where the plan has several."""
        where = f"device {self.index} " if len(self.plan.devices) > 1 else ""
        return self.progress.phase(where + name, total, unit, verb)


def sum_over_ranks(x: torch.Tensor) -> torch.Tensor:
    """StepContext.reduce of a tensor-parallel boot: x summed over the process group's ranks (all-reduce: gloo
    between CPU processes, NCCL between GPUs), every rank getting the same sum."""
    import torch.distributed as dist

    x = x.contiguous()
    dist.all_reduce(x)
    return x


def owner(name: str, prefixes: dict[str, str]) -> str | None:
    """The node whose weight_prefix is the longest prefix of a checkpoint tensor name."""
    best = None
    for node, prefix in prefixes.items():
        if name.startswith(prefix) and (best is None or len(prefix) > len(prefixes[best])):
            best = node
    return best


def check_unused(shards: Shards, used: set[str], boot: DeviceBoot) -> None:
    """Nodes may share a prefix (an encoder's `llm.encoder.` inside the LLM node's `llm.`), so each node loads
    leniently and what nobody on this device used is refused here, by owner, but for what a node declares it
    ignores (Node.ignore_weights)."""
    prefixes = {n.name: n.weight_prefix for n in boot.ir.model.nodes}
    ignored = tuple(p for n in boot.ir.model.nodes for p in n.ignore_weights)
    stray = sorted(n for n in shards.where
                   if n not in used and owner(n, prefixes) in boot.nodes and not n.startswith(ignored))
    if stray:
        raise InvalidInput(f"checkpoint has {len(stray)} tensor(s) under this device's nodes that nothing loads",
                           "\n".join(f"  unexpected: {n}" for n in stray[:8]),
                           "check the checkpoint against the model's preset and the nodes' weight_prefix")


def allocate_states(boot: DeviceBoot) -> None:
    """The slots of each linear_state resource this device's nodes bind, as many as the plan gives it."""
    used = {res for n in boot.nodes for res in boot.ir.node(n).resources.values()}
    for res, planned in boot.plan.resources.items():
        if planned.slots is None or res not in used:
            continue
        spec = boot.ir.model.resource(res)
        boot.states[res] = new_state(spec, planned.slots, boot.device)
        boot.slots[res] = SlotAllocator(planned.slots)
        for part, t in (("conv", boot.states[res].conv), ("recurrent", boot.states[res].recurrent)):
            boot.measured[f"state.{res}.{part}"] = t.untyped_storage().nbytes()


def allocate_weights(boot: DeviceBoot, checkpoint: str | None, seed: int) -> None:
    """Each node's module in its arena, its weights read from the checkpoint (or seeded), as the plan's
    kernels read them: the boot's `weights` phase."""
    shards = Shards(checkpoint) if checkpoint else None
    used: set[str] = set()
    total = sum(boot.plan.nodes[name].weights_bytes for name in boot.nodes)
    with boot.phase("weights", total, "B", "loaded" if shards is not None else "seeded") as phase:
        for name in boot.nodes:
            node = boot.ir.node(name)
            module, arena = materialize(node, boot.device)
            set_kernels(module, boot.plan.nodes[name].kernels)      # the plan's kernel choices (select_backends)
            if shards is not None:
                used |= load_weights(module, shards, node.weight_prefix, strict=False, on_bytes=phase.update,
                                     rank=boot.rank, tp=boot.plan.tensor_parallel).used
            else:
                fill_seeded(module, seed)
                phase.update(arena.numel())
            arrange_weights(module)                                 # rows as the chosen kernels read them
            boot.modules[name], boot.arenas[name] = module, arena
            boot.measured[f"weights.{name}"] = arena.numel()
    if shards is not None:
        check_unused(shards, used, boot)


def allocate(boot: DeviceBoot, checkpoint: str | None, seed: int) -> None:
    """Weights, KV pools, state slots, workspaces, receive buffers and media caches in the ledger's order."""
    allocate_weights(boot, checkpoint, seed)
    dev_plan = boot.plan.devices[boot.index]
    for res, pages in dev_plan.kv_pages.items():
        spec = boot.ir.model.resource(res)
        # by the shape the kernels index, not by the plan's page_bytes, so that a wrong formula shows
        # as a difference; zeroed: synthetic steps read history no request wrote
        boot.caches[res] = new_cache(spec, pages, boot.device)
        boot.pages[res] = PageAllocator(pages)
        boot.measured[f"kv.{res}"] = boot.caches[res].untyped_storage().nbytes()
    allocate_states(boot)
    for comp, nbytes in dev_plan.ledger.items():
        if comp.startswith("workspace."):
            name = comp.split(".", 1)[1]
            spec = boot.ir.model.resource(name)
            slots = spec.slots if isinstance(spec, WorkspaceSpec) else 1
            ws = [torch.zeros(nbytes // slots, dtype=torch.uint8, device=boot.device) for _ in range(slots)]
            boot.workspaces[name] = ws
            boot.measured[comp] = sum(w.numel() for w in ws)
    for src, port, numel, dtype in boot.ir.transfers_into(boot.nodes):    # other devices' outputs arrive here
        buf = torch.empty(numel, dtype=TORCH_DTYPES[dtype], device=boot.device)
        boot.transfers[(src, port)] = buf
        comp = f"transfers.{src}"
        boot.measured[comp] = boot.measured.get(comp, 0) + buf.untyped_storage().nbytes()
    allocate_caches(boot)                                                   # the row caches (media_rows)
