"""A code predictor layer's q/k norm, rotary, frame-cache write and attention in one Triton launch (the talker's
frame_attend knob).

A code predictor step attends over one frame: its sequence's G code slots, of which the step adds N (2 at the
first step, then 1). The unfused path is two launches a layer: q_k_norm_rope writes the step's normed and rotated
q and k, and v, into the frame cache's slots (norm_triton.py), then the code predictor's ragged attention runs
every slot of every frame (resources/ragged_triton.py), of which the step keeps its N rows. Here a program per
(sequence, kv head) does both:

    1. the step's rows of q (the kv head's GROUP query heads) and k: rms_norm * w, then rotary, rounded where the
       torch path rounds (norm_triton._norm_rope_heads, one head at a time as q_k_norm_rope at a few rows, so the
       cache holds the same bits), written into the cache's q and k slots, v copied into its v slots;
    2. a barrier (the program reads back what its threads wrote);
    3. the step's N x GROUP query rows against the frame's first FIRST + N keys, causal (slot i sees keys c <= i):
       s = q . k in fp32 (bf16 products are exact in fp32), softmax in fp32 (exp2 of the scaled scores),
       o = p . v in fp32, rounded once to the output's dtype (to nearest, norm_triton._round): the ragged
       kernel's arithmetic, summed in another order (its q . k is a tensor-core product).

At N x GROUP <= 4 query rows and G = 16 keys the products are broadcast sums in registers; a tensor-core product
needs 16 rows. tests/unit/test_frame_triton.py runs it under Triton's interpreter on CPU against the two launches
it replaces and fp64; tests/gpu/test_frame_gpu.py compiled at the talker's shapes.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from models.components.norm_triton import _norm_rope_heads, _round
from resources.pdl import _pdl_start, _pdl_wait, pdl_launch

LOG2E = 1.4426950408889634


@triton.jit
def _frame_norm_rope(q_ptr, k_ptr, v_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, qc_ptr, kc_ptr, vc_ptr, seq, kvh,
                     FIRST, q_s, q_n, q_h, k_s, k_n, k_h, v_s, v_n, v_h, qc_s, qc_g, qc_h, kc_s, kc_g, kc_h,
                     vc_s, vc_g, vc_h, c_n, eps, N: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr):
    """Step 1: the step's N rows of q (heads kvh * GROUP ...), k and v (head kvh) into the cache's slots."""
    d = tl.arange(0, D)
    for i in tl.static_range(N):
        c_base, s_base = cos_ptr + i * c_n, sin_ptr + i * c_n
        slot = FIRST + i
        for j in tl.static_range(GROUP):
            _norm_rope_heads(q_ptr + seq * q_s + i * q_n, q_h, wq_ptr, c_base, s_base,
                             qc_ptr + seq * qc_s + slot * qc_g, qc_h, kvh * GROUP + j, kvh * GROUP + j + 1, eps, D, 1)
        _norm_rope_heads(k_ptr + seq * k_s + i * k_n, k_h, wk_ptr, c_base, s_base, kc_ptr + seq * kc_s + slot * kc_g,
                         kc_h, kvh, kvh + 1, eps, D, 1)
        x = tl.load(v_ptr + seq * v_s + i * v_n + kvh * v_h + d)
        tl.store(vc_ptr + seq * vc_s + slot * vc_g + kvh * vc_h + d, x)


@triton.jit
def _frame_attend(q_ptr, k_ptr, v_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, qc_ptr, kc_ptr, vc_ptr, o_ptr, FIRST,
                  q_s, q_n, q_h, k_s, k_n, k_h, v_s, v_n, v_h, qc_s, qc_g, qc_h, kc_s, kc_g, kc_h, vc_s, vc_g, vc_h,
                  o_s, o_n, o_h, c_n, eps, scale_log2, N: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                  SEG: tl.constexpr, R: tl.constexpr, PDL: tl.constexpr = False):
    """A program per (sequence, kv head): steps 1-3 of the module's docstring."""
    _pdl_start(PDL)
    _pdl_wait(PDL)
    seq, kvh = tl.program_id(0), tl.program_id(1)
    _frame_norm_rope(q_ptr, k_ptr, v_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, qc_ptr, kc_ptr, vc_ptr, seq, kvh, FIRST,
                     q_s, q_n, q_h, k_s, k_n, k_h, v_s, v_n, v_h, qc_s, qc_g, qc_h, kc_s, kc_g, kc_h, vc_s, vc_g, vc_h,
                     c_n, eps, N, GROUP, D)
    tl.debug_barrier()                          # the cache's new slots, written by this program's threads
    r = tl.arange(0, R)                         # stacked query rows: slot FIRST + r // GROUP, head r % GROUP
    i, h = r // GROUP, kvh * GROUP + r % GROUP
    qm = i < N
    c = tl.arange(0, SEG)                       # the frame's key slots
    d = tl.arange(0, D)
    q = tl.load(qc_ptr + seq * qc_s + (FIRST + i)[:, None] * qc_g + h[:, None] * qc_h + d[None, :],
                mask=qm[:, None], other=0.0).to(tl.float32)
    km = (c < FIRST + N)[:, None]
    k = tl.load(kc_ptr + seq * kc_s + c[:, None] * kc_g + kvh * kc_h + d[None, :], mask=km, other=0.0)
    v = tl.load(vc_ptr + seq * vc_s + c[:, None] * vc_g + kvh * vc_h + d[None, :], mask=km, other=0.0)
    s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2) * scale_log2        # [R, SEG], log2 units
    see = qm[:, None] & (c[None, :] <= (FIRST + i)[:, None])
    s = tl.where(see, s, float("-inf"))
    m = tl.max(s, axis=1)
    p = tl.where(see, tl.exp2(s - m[:, None]), 0.0)
    l = tl.sum(p, axis=1)
    o = tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1) / tl.where(l == 0.0, 1.0, l)[:, None]
    dt = o_ptr.dtype.element_ty
    tl.store(o_ptr + seq * o_s + i[:, None] * o_n + h[:, None] * o_h + d[None, :],
             _round(o, dt == tl.bfloat16).to(dt), mask=qm[:, None])      # to nearest here and in the interpreter


def frame_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, qc: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                 o: torch.Tensor, first: int, eps: float, pdl: bool = False) -> None:
    """q [S, N, HQ, D], k and v [S, N, HK, D] (rows and heads may be strided, elements contiguous): the step's
    rows at slots first .. first + N - 1 of each sequence's frame; wq, wk [D]; cos, sin [N, D] those slots'
    rotary rows; qc [S, G, HQ, D], kc and vc [S, G, HK, D]: one layer's frame cache, written at those slots;
    o [S, N, HQ, D]: the attention output of the step's rows. pdl: as norm_triton.rms_norm's."""
    s, n, hq, d = q.shape
    hk, g = k.shape[2], kc.shape[1]
    if s:
        _frame_attend[(s, hk)](
            q, k, v, wq, wk, cos, sin, qc, kc, vc, o, first, q.stride(0), q.stride(1), q.stride(2), k.stride(0),
            k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), qc.stride(0), qc.stride(1), qc.stride(2),
            kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2), o.stride(0),
            o.stride(1), o.stride(2), cos.stride(0), eps, LOG2E / math.sqrt(d), N=n, GROUP=hq // hk, D=d,
            SEG=triton.next_power_of_2(g), R=triton.next_power_of_2(n * (hq // hk)), num_warps=4,
            **pdl_launch(pdl, q))
