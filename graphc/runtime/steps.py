"""Synthetic steps: inputs and attention layouts for a node at one rung, used to warm up, capture
and check every planned graph before real traffic (and by the CPU boot to run every rung)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphc.declare import Node
from graphc.ir import Step
from graphc.step import TORCH_DTYPES
from resources.paged_kv import PagedKVSpec
from resources.ragged_attention import RaggedAttentionSpec


@dataclass(frozen=True)
class RaggedLayout:
    cu_q: list[int]
    cu_k: list[int]

    def args(self) -> tuple:
        """What RaggedTorch takes after its spec and a FlashInfer ragged backend's plan() takes."""
        return self.cu_q, self.cu_k


@dataclass(frozen=True)
class PagedLayout:
    qo_lens: list[int]
    kv_lens: list[int]
    page_tables: list[list[int]]

    def args(self) -> tuple:
        """What PagedTorch takes after its spec and cache and a FlashInfer paged backend's plan() takes."""
        return self.qo_lens, self.kv_lens, self.page_tables


def split(rows: int, parts: int, most: int | None = None) -> list[int]:
    """rows into `parts` near-equal pieces (each at most `most`, when given)."""
    parts = max(1, min(parts, rows)) if rows else 1
    if most is not None:
        parts = max(parts, -(-rows // most))
    base, extra = divmod(rows, parts)
    return [base + (i < extra) for i in range(parts)]


def cumsum(xs: list[int]) -> list[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def ragged_layout(spec: RaggedAttentionSpec, step: Step, rung: int) -> RaggedLayout:
    shape = spec.step_shape(step.axis, step.sizes_at(rung), step.phase)
    cu = cumsum(split(shape.rows, shape.seqs, spec.max_segment))
    return RaggedLayout(cu, cu)


def paged_layout(spec: PagedKVSpec, step: Step, rung: int, num_pages: int, history: int = 0) -> PagedLayout:
    """Rows spread over the step's sequences; each sequence has `history` earlier tokens (decode
    rows sit after it). Pages are handed out from the start of the pool; a pool smaller than the step's
    sequences need at once (a plan may hold fewer pages than its largest rung touches) is reused
    round-robin: the data is synthetic, so sequences may share pages."""
    shape = spec.step_shape(step.axis, step.sizes_at(rung), step.phase)
    qo = split(shape.rows, shape.seqs)
    if step.phase == "decode":
        history = max(history, spec.page_size + 1)
    kv = [q + history for q in qo]
    tables, nxt = [], 0
    for n in kv:
        need = spec.pages_for(n)
        tables.append([(nxt + i) % num_pages for i in range(need)])
        nxt += need
    return PagedLayout(qo, kv, tables)


def layouts(ir, kv_pages: dict[str, int], step: Step, rung: int) -> dict[str, tuple]:
    """role -> (spec, layout) of every resource a node calls, for one synthetic step."""
    out = {}
    for role, res in ir.node(step.node).resources.items():
        spec = ir.model.resource(res)
        if isinstance(spec, RaggedAttentionSpec):
            out[role] = spec, ragged_layout(spec, step, rung)
        elif isinstance(spec, PagedKVSpec):
            out[role] = spec, paged_layout(spec, step, rung, kv_pages[res])
        else:
            raise TypeError(f"resource kind {spec.kind} has no synthetic layout")
    return out


def synthetic_inputs(node: Node, step: Step, rung: int, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """Index inputs are zeros (a valid index everywhere); float inputs small random values."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    sizes = step.sizes_at(rung)
    out = {}
    for name in step.inputs:
        port = node.inputs[name]
        shape, dtype = port.concrete(sizes), TORCH_DTYPES[port.dtype]
        if dtype.is_floating_point:
            out[name] = (torch.randn(shape, generator=gen) * 0.1).to(device=device, dtype=dtype)
        else:
            out[name] = torch.zeros(shape, dtype=dtype, device=device)
    return out
