"""Ragged attention for encoders: many short segments packed by cu_seqlens, no KV cache.

Audio windows (104 tokens, bidirectional), one segment per image or frame group (vision).
Backends: FlashInfer's ragged prefill wrapper on GPU; torch SDPA per segment on the CPU.
"""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from resources import flashinfer_sizes as fis
from resources.base import ResourceSpec, Sized, StepShape
from resources.capabilities import USES_FLOAT_WORKSPACE


class RaggedAttentionSpec(ResourceSpec):
    kind: ClassVar[str] = "ragged_attention"
    num_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    num_kv_heads: int | None = Field(None, ge=1)
    max_segment: int = Field(ge=1)   # the longest segment a step may hold (e.g. 104-token windows)
    causal: bool = False
    backend: str = "auto"
    workspace: str | None = None     # a WorkspaceSpec to share; None: the compiler sizes one
    int_workspace_bytes: int = Field(fis.DEFAULT_INT_WORKSPACE, ge=4096)

    @model_validator(mode="after")
    def _heads(self) -> "RaggedAttentionSpec":
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.kv_heads}")
        return self

    @property
    def is_attention(self) -> bool:
        return True

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    def step_shape(self, axis: str, sizes: dict[str, int], phase: str) -> StepShape:
        """Windows carry max_segment rows each and one segment each; other axes count rows and
        take their segment count from the walk's seqs budget (one image or frame group each)."""
        if axis == "windows":
            return StepShape(rows=sizes["windows"] * self.max_segment, seqs=sizes["windows"], kv_len=self.max_segment)
        rows = sizes[axis]
        return StepShape(rows=rows, seqs=min(rows, sizes.get("seqs", 1)), kv_len=min(rows, self.max_segment))

    def float_workspace(self, backend: str, shape: StepShape, num_sms: int) -> Sized:
        if backend not in USES_FLOAT_WORKSPACE:
            return Sized(0, f"{backend} keeps no split-KV partials in the float workspace")
        return fis.fa2_prefill_float_workspace(shape.rows, shape.seqs, self.num_heads, self.kv_heads,
                                               self.head_dim, num_sms)

    def wrapper_allocs(self, backend: str, shape: StepShape) -> list[tuple[str, int]]:
        """Buffers one captured wrapper keeps for its rung: int workspace and fixed indptrs."""
        if backend == "torch":
            return []
        indptr = 4 * (shape.seqs + 1)
        return [("int_workspace", self.int_workspace_bytes), ("qo_indptr", indptr), ("kv_indptr", indptr)]

    def fake(self, shape: StepShape) -> "FakeRagged":
        return FakeRagged(self)


class FakeRagged:
    """The simulation's stand-in: allocates exactly what the kernel returns, computes nothing."""

    def __init__(self, spec: RaggedAttentionSpec):
        self.spec = spec

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return q.new_empty(q.shape[:-1] + (v.shape[-1],))  # [T, Hq, Dv]


class RaggedTorch:
    """CPU backend (and GPU reference): SDPA over each segment of cu_seqlens."""

    def __init__(self, spec: RaggedAttentionSpec, cu_seqlens: list[int]):
        if cu_seqlens[0] != 0 or any(b < a for a, b in zip(cu_seqlens, cu_seqlens[1:])):
            raise ValueError(f"cu_seqlens must start at 0 and never decrease: {cu_seqlens}")
        self.spec, self.cu = spec, list(cu_seqlens)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q [T, Hq, D], k/v [T, Hkv, D]
        group = q.shape[1] // k.shape[1]
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        for start, end in zip(self.cu, self.cu[1:]):
            if end == start:
                continue
            qs = q[start:end].transpose(0, 1)
            ks = k[start:end].transpose(0, 1).repeat_interleave(group, 0)
            vs = v[start:end].transpose(0, 1).repeat_interleave(group, 0)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=self.spec.causal)
            out[start:end] = o.transpose(0, 1)
        return out


