"""Synthetic steps: inputs and attention layouts for a node at one rung, used to warm up, capture
and check every planned graph before real traffic (and by the CPU boot to run every rung)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphc.declare import Node
from graphc.ir import Step
from graphc.step import TORCH_DTYPES
from resources.linear_state import LinearStateSpec
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


@dataclass(frozen=True)
class StateLayout:
    slot_ids: list[int]          # each sequence's slot, distinct within a step
    seq_lens: list[int]          # each sequence's rows in the step
    has_state: list[bool]        # whether its slot holds the sequence's earlier rows (False: its first chunk)

    def args(self) -> tuple:
        """What StateStep takes after the state."""
        return self.slot_ids, self.seq_lens, self.has_state


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


def state_layout(spec: LinearStateSpec, step: Step, rung: int, num_slots: int) -> StateLayout:
    """Rows spread over the step's sequences, each in a slot of its own; decode rows continue a state, prefill
    rows start one."""
    shape = spec.step_shape(step.axis, step.sizes_at(rung), step.phase)
    lens = split(shape.rows, shape.seqs)
    if len(lens) > num_slots:
        raise ValueError(f"{step.node} on {step.walk} at {step.axis}={rung} runs {len(lens)} sequences; "
                         f"{spec.name} has {num_slots} slots")
    return StateLayout(list(range(len(lens))), lens, [step.phase == "decode"] * len(lens))


def layouts(ir, kv_pages: dict[str, int], step: Step, rung: int, slots: dict[str, int] | None = None
            ) -> dict[str, tuple]:
    """role -> (spec, layout) of every resource a node calls, for one synthetic step (slots: each
    linear_state resource's slot count)."""
    out = {}
    for role, res in ir.node(step.node).resources.items():
        spec = ir.model.resource(res)
        if isinstance(spec, RaggedAttentionSpec):
            out[role] = spec, ragged_layout(spec, step, rung)
        elif isinstance(spec, PagedKVSpec):
            out[role] = spec, paged_layout(spec, step, rung, kv_pages[res])
        elif isinstance(spec, LinearStateSpec):
            out[role] = spec, state_layout(spec, step, rung, (slots or {})[res])
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
