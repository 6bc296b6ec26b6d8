"""Ragged attention over short segments in one Triton launch: the 'triton' backend of RaggedAttentionSpec.

A program per (segment, kv head) holds the whole segment in registers: its keys and values [SEG, D] and the
queries of every head of the kv head's group, stacked as [SEG x GROUP, D] (row i x GROUP + j: the segment's
query i at the group's head j), so the scores are one product and the output another:

    s = q . k^T (bf16 in, fp32 out)  masked (causal: query i of nq sees key c iff c <= nk - nq + i; a window
    of w keys: and c > nk - nq + i - w; keys past nk never) -> softmax in fp32 (exp2 of the scaled scores)
    -> o = p . v (fp32, ieee) -> the output's dtype

FlashInfer's ragged prefill plans tiles for long segments; a code predictor frame is 16 rows (a launch per
layer pass, 75 per talker step), where its kernel takes 5.9 us on the H200 (docs/benchmarks.md). A query
row with no key to see (a segment of more queries than keys, causal) is written as zeros.

Segments must be at most SEG rows (queries and keys alike): backends built by RaggedTriton take a
resource with a fixed segment length (rows_per_segment) up to capabilities.SHORT_SEGMENT, which the
compiler checks (capabilities.choose); plan() refuses a longer one. The launch covers a fixed number of
segments per captured rung, and plan() lays the rung's padding rows out as spare segments of
rows_per_segment rows each, so every output row is written (padding rows attend to themselves).

tests/unit/test_ragged_triton.py runs it under Triton's interpreter on CPU against RaggedTorch;
tests/gpu/test_ragged_triton_gpu.py compiled at the code predictor's shapes against fp32 and FlashInfer.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from resources.base import StepShape
from resources.ragged_attention import RaggedAttentionSpec, check_cu
from resources.pdl import _pdl_start, _pdl_wait, pdl_launch

LOG2E = 1.4426950408889634


@triton.jit
def _ragged_short(q_ptr, k_ptr, v_ptr, o_ptr, qo_ptr, kv_ptr, scale_log2, q_t, q_h, k_t, k_h, v_t, v_h, o_t, o_h,
                  D, WINDOW, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, GROUP: tl.constexpr,
                  SEG: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    _pdl_start(PDL)
    _pdl_wait(PDL)                      # with PDL: q, k, v and the indptrs are the kernels' before
    seg, kvh = tl.program_id(0), tl.program_id(1)
    qs, qe = tl.load(qo_ptr + seg), tl.load(qo_ptr + seg + 1)
    ks, ke = tl.load(kv_ptr + seg), tl.load(kv_ptr + seg + 1)
    nq, nk = qe - qs, ke - ks
    r = tl.arange(0, SEG * GROUP)                  # stacked query rows: position r // GROUP, head r % GROUP
    i, h = r // GROUP, kvh * GROUP + r % GROUP
    c = tl.arange(0, SEG)                          # key positions
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    qm = (i < nq)[:, None] & dm[None, :]
    km = (c < nk)[:, None] & dm[None, :]
    q = tl.load(q_ptr + (qs + i).to(tl.int64)[:, None] * q_t + h[:, None] * q_h + d[None, :], mask=qm, other=0.0)
    k = tl.load(k_ptr + (ks + c).to(tl.int64)[:, None] * k_t + kvh * k_h + d[None, :], mask=km, other=0.0)
    v = tl.load(v_ptr + (ks + c).to(tl.int64)[:, None] * v_t + kvh * v_h + d[None, :], mask=km, other=0.0)
    s = tl.dot(q, tl.trans(k), out_dtype=tl.float32) * scale_log2          # [SEG x GROUP, SEG], log2 units
    see = (c < nk)[None, :] & (i < nq)[:, None]
    if CAUSAL:
        last = nk - nq + i                          # the last key query i sees
        see = see & (c[None, :] <= last[:, None])
        if HAS_WINDOW:
            see = see & (c[None, :] > (last - WINDOW)[:, None])
    s = tl.where(see, s, float("-inf"))
    m = tl.max(s, axis=1)
    p = tl.where(see, tl.exp2(s - m[:, None]), 0.0)   # a row that sees nothing: all p 0, its output 0
    l = tl.sum(p, axis=1)
    o = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    o = o / tl.where(l == 0.0, 1.0, l)[:, None]
    tl.store(o_ptr + (qs + i).to(tl.int64)[:, None] * o_t + h[:, None] * o_h + d[None, :],
             o.to(o_ptr.dtype.element_ty), mask=qm)


def block_rows(max_segment: int) -> int:
    """The rows a program holds (tl.dot takes 16 and up): the segment bound's next power of two."""
    return max(16, triton.next_power_of_2(max_segment))


class RaggedTriton:
    """RaggedAttentionSpec on _ragged_short, with RaggedFlashInfer's calls: plan(cu_q, cu_k) on the host, then
    __call__(q, k, v), capturable when built for a rung (its indptrs are fixed buffers plan() rewrites)."""

    def __init__(self, spec: RaggedAttentionSpec, rung: StepShape | None = None, device: str | torch.device = "cuda",
                 buffers: dict[str, torch.Tensor] | None = None, pdl: bool = False):
        if spec.rows_per_segment is None:
            raise ValueError(f"resource '{spec.name}': the triton backend takes segments of a fixed length "
                             "(rows_per_segment)")
        self.spec, self.rung, self.device = spec, rung, torch.device(device)
        self.run_head_dim = spec.head_dim      # runs any head dim as it is (a power-of-two block, masked)
        self.seg = block_rows(spec.max_segment)
        self.buffers = buffers or {}
        self.pdl = pdl              # launched with programmatic dependent launch (the node's pdl knob)
        self._segments: int | None = None

    def _layout(self, cu_q: list[int], cu_k: list[int]) -> tuple[list[int], list[int]]:
        qo, kv = check_cu(cu_q, "cu_seqlens_q"), check_cu(cu_k, "cu_seqlens_k")
        if len(qo) != len(kv):
            raise ValueError(f"{len(qo) - 1} query segments but {len(kv) - 1} key segments")
        if self.rung is not None:
            seg, pad, segs = self.spec.rows_per_segment, self.rung.rows - qo[-1], len(qo) - 1
            while pad > 0 and len(qo) - 1 < self.rung.seqs and qo == kv:      # spare segments of padding rows
                n = min(seg, pad)
                qo.append(qo[-1] + n)
                kv.append(kv[-1] + n)
                pad -= n
            if pad > 0 or segs > self.rung.seqs:
                raise ValueError(f"{segs} segments over {cu_q[-1]} rows do not fit a rung of {self.rung.seqs} "
                                 f"segments of {self.spec.rows_per_segment} rows ({self.rung.rows} rows)")
            qo += [qo[-1]] * (self.rung.seqs + 1 - len(qo))
            kv += [kv[-1]] * (self.rung.seqs + 1 - len(kv))
        longest = max([b - a for cu in (qo, kv) for a, b in zip(cu, cu[1:])], default=0)
        if longest > self.seg:
            raise ValueError(f"resource '{self.spec.name}': a segment of {longest} rows; the triton backend holds "
                             f"at most {self.seg} (max_segment {self.spec.max_segment})")
        return qo, kv

    def plan(self, cu_seqlens_q: list[int], cu_seqlens_k: list[int] | None = None) -> None:
        qo, kv = self._layout(cu_seqlens_q, cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k)
        ints = torch.tensor([qo, kv], dtype=torch.int32)
        if self.rung is None:
            self.buffers = {"qo_indptr": ints[0].to(self.device, non_blocking=True),
                            "kv_indptr": ints[1].to(self.device, non_blocking=True)}
        else:
            self.buffers["qo_indptr"].copy_(ints[0], non_blocking=True)      # staged now: no host sync
            self.buffers["kv_indptr"].copy_(ints[1], non_blocking=True)
        self._segments = len(qo) - 1

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q [Tq, Hq, D], k/v [Tk, Hkv, D] -> [Tq, Hq, Dv]
        if self._segments is None:
            raise RuntimeError("plan() the step's layout before calling the backend")
        s = self.spec
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        d = q.shape[-1]
        if self._segments:
            _ragged_short[(self._segments, s.kv_heads)](
                q, k, v, out, self.buffers["qo_indptr"], self.buffers["kv_indptr"], LOG2E / math.sqrt(s.head_dim),
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0),
                out.stride(1), d, s.window or 0, CAUSAL=s.causal, HAS_WINDOW=s.window is not None,
                GROUP=s.num_heads // s.kv_heads, SEG=self.seg, BLOCK_D=triton.next_power_of_2(d), num_warps=4,
                **pdl_launch(self.pdl, q))
        return out
