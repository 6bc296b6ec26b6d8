"""Runs one scheduled step on a booted device: the walk's encoders on their pieces, then the LLM node on
the step's rows, with encoder rows spliced through the declaration's edges. Returns the logits of the
rows that sample, and of the prompt rows that score the next prompt token (prompt logprobs).

The CPU runs every step eagerly on the torch backends. On a GPU a step at a captured rung copies its
inputs into the family's static buffers, plans the rung's backends and replays the graph; a step past
the captured rungs runs eagerly on backends of its own size (graphc/runtime/gpu_step.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphc.declare import Node
from graphc.errors import WorkerDied
from graphc.host_inputs import PIN_BYTES, input_blocks
from graphc.ir import Step
from graphc.plan import Plan
from graphc.runtime.boot import DeviceBoot, torch_binding
from graphc.runtime.flight import resolve
from graphc.runtime.media_cache import media_caches
from graphc.serving import Host
from graphc.runtime.scheduler import StepPlan
from graphc.step import TORCH_DTYPES, StepContext
from resources.linear_state import LinearStateSpec
from resources.paged_kv import PagedKVSpec
from resources.ragged_attention import RaggedAttentionSpec


def text_kind(stages: list) -> bool:
    """A request kind with text out: its stages are single walks (speech runs walks side by side)."""
    return all(isinstance(s, str) for s in stages)


def llm_node(plan: Plan) -> str:
    """The node that decodes text: the pipeline's LLM stage's."""
    return plan.pipeline.llm.node


def rows_port(node: Node, port: str) -> str:
    """The int64 [tokens] port in the same optional group as `port`: which encoder row each token row takes."""
    group = node.inputs[port].optional
    found = [p for p, spec in node.inputs.items() if spec.optional == group and p != port
             and spec.dtype == "int64" and spec.shape == ("tokens",)]
    if group is None or len(found) != 1:
        raise RuntimeError(f"{node.name}.{port}: its optional group needs exactly one int64 [tokens] row-index port")
    return found[0]


@dataclass
class StepResult:
    logits: torch.Tensor                      # [S, vocab] of the rows that sample, in chunk order
    outputs: dict[str, torch.Tensor]          # every output of the LLM node (views: read before the next step)
    rows: list[tuple[str, int]]               # (request id, row) of each LLM row
    scores: torch.Tensor | None = None        # [R, vocab] of the chunks' scored rows (Chunk.score), in chunk order


def scratch_pages(boot: DeviceBoot) -> dict[str, int]:
    """A page of each paged pool and a slot of each state pool (the plan's padding slot) that padding rows of a
    captured rung write (GPU; the CPU pads nothing)."""
    if boot.device.type != "cuda":
        return {}
    return ({res: alloc.allocate(1)[0] for res, alloc in boot.pages.items()}
            | {res: alloc.reserve() for res, alloc in boot.slots.items()})


class NodeRunner:
    """Runs the nodes of one booted device: replays a captured rung (GPU) or runs eagerly."""

    def __init__(self, boot: DeviceBoot, scratch: dict[str, int] | None = None, ranks=None):
        """scratch: a page of each paged resource that padding rows of a captured rung write (GPU). ranks: the
        other tensor-parallel ranks (graphc/runtime/tensor_parallel.py), which run every step this one runs."""
        self.boot, self.model, self.ranks = boot, boot.ir.model, ranks
        self.gpu, self.blocks = None, {}        # (node, port) -> its page-locked staging block (GPU)
        if boot.device.type == "cuda":
            from graphc.runtime.gpu_step import GpuSteps
            self.gpu = GpuSteps(boot, scratch or {})
            self.blocks = input_blocks(boot.ir, boot.nodes)

    def _cast(self, node: Node, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Inputs on the device in their declared dtypes; host tensors copied async (staged now, no host sync
        that would wait for the step in flight)."""
        return {k: staged(v, self.blocks.get((node.name, k))).to(
                    device=self.boot.device, dtype=TORCH_DTYPES[node.inputs[k].dtype], non_blocking=True)
                for k, v in inputs.items()}

    def run_node(self, node: str, walk: str, rung: int | None, size: int, inputs: dict, layouts: dict) -> dict:
        """One node of a step: replay its rung (GPU), or run it eagerly. layouts: role -> its layout. With other
        tensor-parallel ranks, they start the same step first; a step that fails here once they have leaves
        the ranks out of step: WorkerDied (the engine stops)."""
        if self.ranks is None:
            return self._run_node(node, walk, rung, size, inputs, layouts)
        self.ranks.launch(node, walk, rung, size, inputs, layouts)
        try:
            out = self._run_node(node, walk, rung, size, inputs, layouts)
        except WorkerDied:
            raise
        except Exception as e:
            self.ranks.check(grace=2.0)                # a rank that died is the cause: say so
            raise WorkerDied(f"{node}'s step failed on rank 0 after the other tensor-parallel ranks started it",
                             f"{type(e).__name__}: {e}", "the ranks are out of step; the engine stops") from e
        self.ranks.ran(node, out)
        return out

    def _run_node(self, node: str, walk: str, rung: int | None, size: int, inputs: dict, layouts: dict) -> dict:
        decl = self.model.node(node)
        inputs = self._cast(decl, inputs)
        if self.gpu is not None:
            return self.gpu.run(node, walk, rung, size, inputs, layouts)
        binds = {}
        for role, res in decl.resources.items():
            spec = self.model.resource(res)
            lay = layouts[role]
            binds[role] = torch_binding(self.boot, spec, (lay,) if isinstance(spec, RaggedAttentionSpec) else lay)
        with torch.inference_mode():
            return self.boot.modules[node](StepContext(binds, self.boot.reduce), **inputs)


def staged(t: torch.Tensor, block: int | None) -> torch.Tensor:
    """A large pageable host tensor bound for a GPU, copied into a page-locked block of `block` bytes (its
    port's, as graphc/host_inputs.py input_blocks plans it). From pageable memory the copy to the device
    runs through the driver's staging buffer: the calling thread copies chunk by chunk while the device waits
    on each (a 30 s clip's patches in fp32, 162 MB: 86 ms of the engine's thread and 40 ms of copies on the
    device, on an H100); from page-locked memory it is one DMA behind the thread's back. torch's host
    allocator keeps the block until the copy that reads it has run, then hands it to the next step (a port's
    block is always its planned size). Small, pinned, device or oversized tensors, and ports with no block,
    are returned as they are."""
    if not block or t.device.type != "cpu" or not PIN_BYTES <= t.nbytes <= block or t.is_pinned():
        return t
    view = torch.empty(block, dtype=torch.uint8, pin_memory=True)[:t.nbytes].view(t.dtype).view(t.shape)
    return view.copy_(t)


class Executor:
    def __init__(self, boot: DeviceBoot, host: Host, llm: str, scratch: dict[str, int] | None = None,
                 workers=None, ranks=None):
        """scratch: a page of each paged resource that padding rows of a captured rung write (GPU).
        workers: the plan's other devices (graphc/runtime/workers.py), for nodes this device does not hold.
        ranks: the plan's other tensor-parallel ranks (graphc/runtime/tensor_parallel.py)."""
        self.boot, self.host, self.llm = boot, host, llm
        self.reserved = {res: 1 for res in (scratch or {})}
        # every paged pool's page bookkeeping: this device's, and the workers' (their pages are kept here)
        self.pools = dict(boot.pages)
        if workers is not None:
            self.pools |= workers.pools
            self.reserved |= workers.reserved
        self.model = boot.ir.model
        self.steps: dict[tuple[str, str], Step] = {(s.node, s.walk): s for s in boot.ir.steps}
        self.kv_role, kv_res = next((role, r) for role, r in self.model.node(llm).resources.items()
                                    if isinstance(self.model.resource(r), PagedKVSpec))
        self.kv_spec: PagedKVSpec = self.model.resource(kv_res)
        self.local = NodeRunner(boot, scratch, ranks)
        self.gpu = self.local.gpu
        self.workers = workers
        # what the LLM reads of each encoder: the source ports of the edges into it
        self.feeds: dict[str, list[str]] = {}
        for e in self.model.edges:
            (src, sport), (dst, _) = e.ends()
            if dst == llm:
                self.feeds.setdefault(src, []).append(sport)
        self.media = media_caches(boot)

    def run_node(self, node: str, walk: str, rung: int | None, size: int, inputs: dict, layouts: dict,
                 want: list[str] | None = None) -> dict:
        """One node of a step, on this device or on the worker of the device that holds it (its outputs
        `want`, by default every one this device has a receive buffer for, then arrive here device to
        device). layouts: role -> its layout."""
        if node in self.boot.nodes:
            return self.local.run_node(node, walk, rung, size, inputs, layouts)
        if want is None:
            want = [p for p in self.model.node(node).outputs if (node, p) in self.workers.buffers]
        return self.workers.run(node, walk, rung, size, inputs, layouts, want)

    def run(self, plan: StepPlan, pending: torch.Tensor | None = None) -> StepResult:
        """pending: the sampled tokens of the step in flight, that the plan's placeholder ids stand for."""
        walk = self.model.walk(plan.walk)
        spliced: dict[str, tuple[dict, dict]] = {}         # encoder -> (outputs, {(request id, row): out row})
        for node in walk.path:
            if node == self.llm:
                continue
            pieces = [(c.req, p) for c in plan.chunks for p in c.pieces if p.node in ("", node)]
            if not pieces:
                continue
            cache = self.media.get(node)          # repeated media's rows (graphc/runtime/media_cache.py)
            spliced[node] = (cache.splice(pieces, lambda todo, node=node: self._encode(plan, node, todo))
                             if cache is not None else self._encode(plan, node, pieces))
        return self._llm(plan, walk, spliced, pending)

    def _encode(self, plan: StepPlan, node: str, pieces: list) -> tuple[dict, dict]:
        """The encoder's outputs for pieces [(request, piece)] at the step's planned size, and where each
        (request id, row) is in them."""
        units = plan.rungs.get(node) or plan.sizes[node]
        batch = self.host.encode(node, [p for _, p in pieces], units)
        out = self.run_node(node, plan.walk, plan.rungs.get(node), plan.sizes[node], batch.inputs, batch.segments,
                            want=self.feeds.get(node, []))
        where = {}
        for (req, piece), offset in zip(pieces, batch.offsets):
            for j, row in enumerate(piece.rows):
                where[(req.id, row)] = offset + j
        return out, where

    def _llm(self, plan: StepPlan, walk, spliced: dict, pending: torch.Tensor | None) -> StepResult:
        decl = self.model.node(self.llm)
        ids, positions, sample, qo, kv, tables, order, scored = [], [], [], [], [], [], [], []
        for c in plan.chunks:
            if c.score is not None:
                scored += range(len(ids) + c.score[0] - c.start, len(ids) + c.score[1] - c.start)
            ids += c.req.row_ids(c.start, c.end)
            positions.append(c.req.prompt.positions_of(c.start, c.end))
            order += [(c.req.id, r) for r in range(c.start, c.end)]
            if c.sample:
                sample.append(len(ids) - 1)
            qo.append(c.end - c.start)
            kv.append(c.end)
            tables.append(c.req.pages)
        pos = torch.cat(positions, dim=1)
        if len(decl.inputs["positions"].shape) == 1:
            pos = pos[0]
        inputs = {"token_ids": resolve(ids, pending), "positions": pos,
                  "sample_rows": torch.tensor(sample + scored, dtype=torch.int64)}
        step = self.steps[(self.llm, plan.walk)]
        fed = set(step.inputs)
        for e in self.model.edges:
            (src, sport), (dst, dport) = e.ends()
            if dst != self.llm or dport not in fed:
                continue
            rport = rows_port(decl, dport)
            if src in spliced:
                out, where = spliced[src]
                inputs[dport] = out[sport]
                inputs[rport] = torch.tensor([where.get(k, -1) for k in order], dtype=torch.int64)
            else:      # the walk feeds the group but no piece ran this step: nothing is spliced
                sizes = step.sizes_at(plan.rungs.get(self.llm) or plan.sizes[self.llm])
                port = decl.inputs[dport]
                inputs[dport] = torch.zeros(port.concrete(sizes), dtype=TORCH_DTYPES[port.dtype])
                inputs[rport] = torch.full((len(ids),), -1, dtype=torch.int64)
        states = {role: ([c.req.slots[res] for c in plan.chunks], qo, [c.start > 0 for c in plan.chunks])
                  for role, res in decl.resources.items() if isinstance(self.model.resource(res), LinearStateSpec)}
        out = self.run_node(self.llm, plan.walk, plan.rungs.get(self.llm), plan.sizes[self.llm], inputs,
                            {self.kv_role: (qo, kv, tables), **states})
        n = len(sample)
        return StepResult(out["logits"][:n], out, order, out["logits"][n:n + len(scored)] if scored else None)
