"""Ragged attention: many short segments packed by cu_seqlens, no persistent KV cache.

Audio windows (104 tokens, bidirectional), one segment per image or frame group (vision), and
Code2Wav's causal sliding window (72 keys including the query's own) over each chunk.
Query and key segments may differ in length (keys of a short in-step cache); causal masks then
align the queries with the last keys. Backends: FlashInfer's ragged prefill wrapper on GPU, or for short
segments of one length this project's Triton kernel (ragged_triton.py); torch SDPA per segment on the CPU.
torch is imported where a backend runs: a plan made from the disk cache reads the spec without it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, model_validator

from graphc.errors import InvalidInput
from resources import flashinfer_sizes as fis
from resources.base import ResourceSpec, Sized, StepShape
from resources.capabilities import USES_FLOAT_WORKSPACE

if TYPE_CHECKING:
    import torch


class RaggedAttentionSpec(ResourceSpec):
    kind: ClassVar[str] = "ragged_attention"
    num_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    num_kv_heads: int | None = Field(None, ge=1)
    max_segment: int = Field(ge=1)   # the longest segment a step may hold (e.g. 104-token windows)
    # When every unit of the node's capture axis is one segment of exactly this many rows (an audio
    # window is 104 rows; the code predictor's frame is 16): rows = units x rows_per_segment.
    rows_per_segment: int | None = Field(None, ge=1)
    # the axis that counts those segments (default: the capture axis); graphc.declare.AXES
    segment_axis: Literal["tokens", "seqs", "windows", "patches", "frames", "segments"] | None = None
    causal: bool = False
    window: int | None = Field(None, ge=1)   # causal sliding window: keys seen per query, itself included
    backend: str = "auto"
    workspace: str | None = None     # a WorkspaceSpec to share; None: the compiler sizes one
    int_workspace_bytes: int = Field(fis.DEFAULT_INT_WORKSPACE, ge=4096)

    @model_validator(mode="after")
    def _heads(self) -> "RaggedAttentionSpec":
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.kv_heads}")
        if self.window is not None and not self.causal:
            raise ValueError("a sliding window needs causal=True")
        if self.rows_per_segment is not None and self.rows_per_segment > self.max_segment:
            raise ValueError(f"rows_per_segment {self.rows_per_segment} exceeds max_segment {self.max_segment}")
        return self

    @property
    def is_attention(self) -> bool:
        return True

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def padding_segments(self) -> int:
        """Segments a step holds beyond its media's for the rows that pad it to its rung: one where the axis
        counts rows (a full step of segments still pads to its rung's rows, in a segment of their own: without
        it the attention reads them as keys of a real segment), none with rows_per_segment (a padded step pads
        whole segments)."""
        return 0 if self.rows_per_segment is not None else 1

    def step_shape(self, axis: str, sizes: dict[str, int], phase: str) -> StepShape:
        """With rows_per_segment, each unit of the capture axis is one segment of that many rows
        (audio windows, code-predictor frames); otherwise the axis counts rows and the walk's segments
        budget, else its seqs, counts segments (one image or frame group each), plus the padding rows' segment."""
        if self.rows_per_segment is not None:
            if (self.segment_axis or axis) not in sizes:
                raise InvalidInput(f"resource '{self.name}' counts its segments along '{self.segment_axis}', which a "
                                   "step of a node that calls it does not size",
                                   f"that step's axes: {', '.join(sizes)}",
                                   f"set resources.{self.name}.segment_axis to one of them, or budget "
                                   f"{self.segment_axis} on each walk through its nodes")
            units = sizes[self.segment_axis or axis]
            return StepShape(rows=units * self.rows_per_segment, seqs=units, kv_len=self.rows_per_segment)
        rows = sizes[axis]
        segments = sizes.get("segments", sizes.get("seqs", 1))
        return StepShape(rows=rows, seqs=min(rows, segments + self.padding_segments),
                         kv_len=min(rows, self.max_segment))

    def float_workspace(self, backend: str, shape: StepShape, num_sms: int, head_dim: int | None = None) -> Sized:
        """head_dim: the one the kernels run at, when they pad this resource's."""
        if backend not in USES_FLOAT_WORKSPACE:
            return Sized(0, f"{backend} keeps no split-KV partials in the float workspace")
        return fis.fa2_prefill_float_workspace(shape.rows, shape.seqs, self.num_heads, self.kv_heads,
                                               head_dim or self.head_dim, num_sms)

    def wrapper_allocs(self, backend: str, shape: StepShape) -> list[tuple[str, int]]:
        """Buffers one captured wrapper keeps for its rung: int workspace and fixed indptrs."""
        if backend == "torch":
            return []
        indptr = 4 * (shape.seqs + 1)
        ints = [] if backend == "triton" else [("int_workspace", self.int_workspace_bytes)]   # triton plans none
        return ints + [("qo_indptr", indptr), ("kv_indptr", indptr)]

    def fake(self, shape: StepShape, run_head_dim: int | None = None) -> "FakeRagged":
        return FakeRagged(self, run_head_dim)


def pad_head_dim(x: torch.Tensor, to: int) -> torch.Tensor:
    """[..., D] -> [..., to], zeros after D: scores and outputs are unchanged for the first D."""
    import torch.nn.functional as F

    return F.pad(x, (0, to - x.shape[-1]))


class FakeRagged:
    """The simulation's stand-in: allocates exactly what the backend allocates, computes nothing.

    A backend that runs a padded head dim makes padded copies of q, k, v (unless they come padded: see
    RaggedFlashInfer) and a padded output whose first columns it returns (a view)."""

    def __init__(self, spec: RaggedAttentionSpec, run_head_dim: int | None = None):
        self.spec = spec
        self.run_head_dim = run_head_dim or spec.head_dim

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s, d = self.spec, self.spec.head_dim
        widths = {q.shape[-1], k.shape[-1], v.shape[-1]}
        if (q.shape[-2], k.shape[-2]) != (s.num_heads, s.kv_heads) or len(widths) != 1 \
                or q.shape[-1] not in (d, self.run_head_dim):
            raise InvalidInput(f"resource '{s.name}' is declared as {s.num_heads} query and {s.kv_heads} key heads of "
                               f"{s.head_dim}, but its node calls it with q {list(q.shape)}, k {list(k.shape)} and "
                               f"v {list(v.shape)}",
                               "the resource's heads are what its kernels and workspaces are sized by",
                               f"set resources.{s.name}'s num_heads, num_kv_heads and head_dim to the module's")
        if self.run_head_dim == d:
            return q.new_empty(q.shape[:-1] + (d,))             # [T, Hq, Dv]
        if q.shape[-1] == d:
            q, k, v = (pad_head_dim(t, self.run_head_dim) for t in (q, k, v))
        return q.new_empty(q.shape)[..., :d]


def check_cu(cu: list[int], what: str) -> list[int]:
    """Cumulative segment bounds as ints: refused unless they start at 0 and never decrease."""
    cu = [int(x) for x in cu]
    if not cu or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"{what} must start at 0 and never decrease: {cu}")
    return cu


class RaggedTorch:
    """CPU backend (and GPU reference): SDPA over each segment.

    cu_seqlens splits the query rows; cu_seqlens_k the key rows (default: the same). With causal
    masks, a segment's last query sees its last key; a window limits each query to that many keys.
    """

    def __init__(self, spec: RaggedAttentionSpec, cu_seqlens: list[int], cu_seqlens_k: list[int] | None = None):
        self.spec = spec
        self.cu = check_cu(cu_seqlens, "cu_seqlens")
        self.cu_k = check_cu(cu_seqlens_k, "cu_seqlens_k") if cu_seqlens_k is not None else self.cu
        if len(self.cu_k) != len(self.cu):
            raise ValueError(f"{len(self.cu) - 1} query segments but {len(self.cu_k) - 1} key segments")
        self.run_head_dim = spec.head_dim      # runs any head dim as it is

    def _mask(self, qn: int, kn: int, device) -> torch.Tensor | None:
        if not self.spec.causal:
            return None
        import torch

        rows = torch.arange(kn - qn, kn, device=device)[:, None]     # each query's position among the keys
        cols = torch.arange(kn, device=device)[None, :]
        mask = cols <= rows
        if self.spec.window is not None:
            mask &= cols > rows - self.spec.window
        return mask

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q [Tq, Hq, D], k/v [Tk, Hkv, D]
        import torch.nn.functional as F

        group = q.shape[1] // k.shape[1]
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        for (qs, qe), (ks, ke) in zip(zip(self.cu, self.cu[1:]), zip(self.cu_k, self.cu_k[1:])):
            if qe == qs:
                continue
            qq = q[qs:qe].transpose(0, 1)
            kk = k[ks:ke].transpose(0, 1).repeat_interleave(group, 0)
            vv = v[ks:ke].transpose(0, 1).repeat_interleave(group, 0)
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=self._mask(qe - qs, ke - ks, q.device))
            out[qs:qe] = o.transpose(0, 1)
        return out


