"""The MoE block's first and last launches, each fused with the launch beside it (issue 37: at most 12 launches a
thinker decoder layer). moe_ops.py makes them torch operators; the two kernels they replace are moe_triton.py's.

    route_group    every token's router (softmax in fp32, top k, renormalised; moe_triton._route's math) and the
                   grouping of the step's token-expert pairs by expert (moe_triton._group's ranks and ends), in
                   one program: for the few pairs of a decode step (at most ROUTE_GROUP_PAIRS), whose two
                   launches were each a few microseconds of latency and almost no work
    sum_add_norm   each token's k slots summed (optionally scaled), the residual added (moe_triton._sum_add's
                   roundings), and the next decoder layer's input RMSNorm of that sum (norm_triton._rms_norm's
                   roundings): one program a token holds the whole row, so the norm needs no second launch

Both round where the launches they replace round, so their outputs are those launches' bit for bit but for the
order of the norm's mean (tests/unit/test_moe_edges_triton.py under Triton's interpreter; tests/gpu at the real
shapes).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.components.moe_triton import _slot_sum, _top_k
from models.components.norm_triton import _round
from resources.pdl import _pdl_start, _pdl_wait, pdl_launch

ROUTE_GROUP_PAIRS = 64       # token-expert pairs route_group takes (T * k): one program holds them all
SUM_NORM_WIDTH = 16384       # the widest row sum_add_norm takes (one program holds a row)


@triton.jit
def _route_row(logits_ptr, ex_ptr, w_ptr, pex, row, E, l_stride, pp, TOP_K: tl.constexpr, NORM: tl.constexpr,
               BLOCK: tl.constexpr, KBLOCK: tl.constexpr):
    """One token's router (moe_triton._top_k), written to its k slots; returns pex with this token's pairs'
    experts placed at row * TOP_K + i."""
    ex, w = _top_k(logits_ptr, row, E, l_stride, TOP_K, NORM, BLOCK, KBLOCK)
    kk = tl.arange(0, KBLOCK)
    tl.store(ex_ptr + row * TOP_K + kk, ex, mask=kk < TOP_K)
    tl.store(w_ptr + row * TOP_K + kk, w.to(w_ptr.dtype.element_ty), mask=kk < TOP_K)
    for i in tl.static_range(TOP_K):
        pex = tl.where(pp == row * TOP_K + i, tl.sum(tl.where(kk == i, ex, 0), axis=0).to(tl.int32), pex)
    return pex


@triton.jit
def _route_group(logits_ptr, ex_ptr, w_ptr, rows_ptr, ends_ptr, T, E, l_stride, TOP_K: tl.constexpr,
                 NORM: tl.constexpr, BLOCK: tl.constexpr, KBLOCK: tl.constexpr, PBLOCK: tl.constexpr,
                 EBLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """One program: the T tokens' routers, then the P = T * TOP_K pairs grouped by expert, as moe_triton._group:
    rows[r] = the pair of rank r (by expert, then by pair index), ends[e] = the pairs whose expert is <= e."""
    _pdl_start(PDL)
    _pdl_wait(PDL)
    pp = tl.arange(0, PBLOCK)
    pex = tl.full([PBLOCK], E, tl.int32)             # each pair's expert; past the pairs: after every expert
    for row in range(0, T):
        pex = _route_row(logits_ptr, ex_ptr, w_ptr, pex, row, E, l_stride, pp, TOP_K, NORM, BLOCK, KBLOCK)
    P = T * TOP_K
    qq = tl.arange(0, PBLOCK)
    ep, eq = tl.expand_dims(pex, 1), tl.expand_dims(pex, 0)
    before = (eq < ep) | ((eq == ep) & (tl.expand_dims(qq, 0) < tl.expand_dims(pp, 1)))
    rank = tl.sum(before.to(tl.int32), axis=1)
    tl.store(rows_ptr + rank, pp, mask=pp < P)
    offs_e = tl.arange(0, EBLOCK)
    ends = tl.sum((eq <= tl.expand_dims(offs_e, 1)).to(tl.int32), axis=1)
    tl.store(ends_ptr + offs_e, ends, mask=offs_e < E)


def route_group(logits: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, rows: torch.Tensor,
                ends: torch.Tensor, norm: bool, pdl: bool = False) -> None:
    """logits [T, E] (rows strided, elements contiguous) -> experts [T, k] int64, weights [T, k], rows [T k]
    int32 (pairs by expert) and ends [E] int32, for T k <= ROUTE_GROUP_PAIRS. pdl: launched with programmatic
    dependent launch (resources/pdl.py)."""
    t, e = logits.shape
    k = experts.shape[1]
    if not 0 < t * k <= ROUTE_GROUP_PAIRS:
        raise ValueError(f"route_group takes 1 to {ROUTE_GROUP_PAIRS} token-expert pairs, not {t} x {k}")
    _route_group[(1,)](logits, experts, weights, rows, ends, t, e, logits.stride(0), TOP_K=k, NORM=norm,
                       BLOCK=triton.next_power_of_2(e), KBLOCK=triton.next_power_of_2(k),
                       PBLOCK=triton.next_power_of_2(t * k), EBLOCK=triton.next_power_of_2(e), num_warps=4,
                       **pdl_launch(pdl, logits))


@triton.jit
def _sum_add_norm(pairs_ptr, w_ptr, res_ptr, nw_ptr, y_ptr, h_ptr, sh_ptr, g_ptr, H, res_row, sh_row, eps,
                  TOP_K: tl.constexpr, BLOCK: tl.constexpr, SCALED: tl.constexpr, GATED: tl.constexpr = False,
                  PDL: tl.constexpr = False):
    """One token: y = residual + its TOP_K slots' sum (each scaled by w[t, j] first where SCALED), the sum in fp32
    rounded once, then the add rounded; h = rms_norm(y) * nw, the normed row rounded before the weight's product.
    GATED: the slots' rounded sum plus a shared expert's row times sigmoid of its gate's logit (HF's order: the
    sigmoid rounded, its product rounded, that sum rounded) before the residual's add."""
    _pdl_start(PDL)
    _pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < H
    BF16: tl.constexpr = y_ptr.dtype.element_ty == tl.bfloat16
    o = _round(_slot_sum(pairs_ptr, w_ptr, t, offs, m, H, TOP_K, BLOCK, SCALED), BF16)
    if GATED:
        g = tl.load(g_ptr + t).to(tl.float32)
        sh = tl.load(sh_ptr + t * sh_row + offs, mask=m, other=0.0).to(tl.float32)
        o = _round(o + _round(_round(1.0 / (1.0 + tl.exp(-g)), BF16) * sh, BF16), BF16)
    r = tl.load(res_ptr + t * res_row + offs, mask=m, other=0.0).to(tl.float32)
    y = _round(r + o, BF16)
    tl.store(y_ptr + t * H + offs, y.to(y_ptr.dtype.element_ty), mask=m)
    rstd = 1.0 / tl.sqrt(tl.sum(y * y, axis=0) / H + eps)
    w = tl.load(nw_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(h_ptr + t * H + offs, _round(w * _round(y * rstd, BF16), BF16).to(h_ptr.dtype.element_ty), mask=m)


def sum_add_norm(pairs: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, y: torch.Tensor,
                 h: torch.Tensor, eps: float, weights: torch.Tensor | None = None, pdl: bool = False,
                 shared: torch.Tensor | None = None, gate: torch.Tensor | None = None) -> None:
    """pairs [T, k, H] contiguous, residual [T, H] (rows may be strided), norm_weight [H]; y, h [T, H] contiguous:
    y = residual + pairs.sum(1) (each slot's row times weights [T, k] first where given), h = rms_norm(y) * w.
    With shared [T, H] (rows may be strided) and gate [T, 1] contiguous: pairs.sum(1) + sigmoid(gate) * shared in
    place of the sum (a gated shared expert's, _sum_add_norm's GATED). pdl: as route_group's."""
    t, k, width = pairs.shape
    if width > SUM_NORM_WIDTH:
        raise ValueError(f"sum_add_norm holds a row in one program: {width} columns > {SUM_NORM_WIDTH}")
    if t:
        block = triton.next_power_of_2(width)
        gated = shared is not None
        _sum_add_norm[(t,)](pairs, pairs if weights is None else weights, residual, norm_weight, y, h,
                            shared if gated else y, gate if gated else y, width, residual.stride(0),
                            shared.stride(0) if gated else 0, eps, TOP_K=k, BLOCK=block, SCALED=weights is not None,
                            GATED=gated, num_warps=4 if block <= 2048 else 8, **pdl_launch(pdl, pairs))
