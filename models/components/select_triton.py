"""talker.select (the talker's in-step sampler: code 0 and each residual code) as one Triton launch, a program
per row.

The torch path is about nineteen small kernels a call on the H200 (a radix sort, 27 us of them at V = 2048, a
softmax, two argmaxes, a scan, a scatter, a gather, compares), called 16 times a talker decode step. Here a
program holds its row [V] in registers (BLOCK = the next power of two, masked) and does all of it:

    x = logits.float(); the repetition penalty over seen; suppressed ids -> -inf
    greedy = the first argmax of x
    x = x / temperature; top-k drops x < the sorted row's kth value; p = softmax of what is left;
    top-p drops each id whose cumulative p along the ascending sort is <= floor, the top id never;
    a sampled row takes the first argmax of x - log E over the ids kept, any other row greedy

No sort. The ascending sort is torch.sort's on CUDA: at V <= 4096 CUB's block radix sort, stable, in the bit
order of the fp32 values (-inf < ... < -1 < +1 < ... < +inf) but for -0.0, which CUB's digit extractor reads as
+0.0 (BaseDigitExtractor::ProcessFloatMinusZero), so the two zeros tie and go by index as in a stable
comparison sort. That is the order of the unique int64 keys (u << log2 BLOCK) | index, u the order-preserving
uint32 image of the value (-0.0 taken as +0.0). Both filters need only a threshold in that order, found by a
binary search of full-row reductions (a masked count, a masked sum), one bit a reduction, high bits first,
which keeps the program small (tl.sort of 4096 int64 keys is 78 compare-exchange stages through shared
memory, then a scatter back; deciding 2 or 4 bits a round by 2-D reductions over the candidates was slower
on the H200: 31 and 53 us a call against 24; a radix select of top-k's value by four 256-bin histograms, exact,
was no faster on an H100 at 8 warps: 17.42 us against 17.63 for a residual code's 2,048 ids, 28.57 against 26.86
for code 0's 3,072, one row; docs/data/h100_2026-12-07b/select_radix.log):
  top-k  u_k = the largest u with count(u_i < u) <= kth is the sorted row's kth value: 32 bits of counts;
         the drop itself compares floats (x < value), as torch's does (-0.0 is not below +0.0);
  top-p  cum along the sort is nondecreasing (p >= 0), so the ids it drops are the keys below some t: t = the
         largest key with sum(p_i : key_i < t) <= floor. The sum is a fixed reduction tree with the masked ids
         as zeros, so it is monotone in t and the search is exact for this arithmetic. Searched in two parts:
         t's value u (the sum over the same ids as at its key (u, 0): the same float), only the bits below the
         common high bits of the least u top-k kept and the top u + 1; then t's index, only where ids tie at
         that u (log2 BLOCK bits). The top key (the sort's last position) is never dropped.
Ties are the sort's: by value, then by index, whatever the dtype (bf16 logits tie often, and top-p's drop is
positional: it can keep one of two equal logits and drop the other).

Rounding: the penalty's product and quotient, the temperature's quotient and the softmax's quotient are fp32
as torch takes them (IEEE division, div_rn: Triton's `/` is an approximate division); exp is libdevice's
expf, CUDA's and so torch's (tl.exp lowers to ex2.approx) where compiled, tl.exp under the interpreter, which
has no libdevice. What cannot match is the order of the softmax's sum and of the cumulative sum (torch: a
block reduction and a scan; here a reduction tree), so the cumulative probability differs from torch's in its
last bits, and where it lies within a few ulp of floor `cum <= floor` can flip: an id at the top-p boundary
kept here and dropped there or back (it changes a code only if that id then wins the race). Everything else
is exact: top-k, the greedy and race argmaxes (the first index among equal maxima, as torch's), suppression.
NaN logits are not handled as torch handles them.

Under the select_fold knob a program also takes its row's sampling columns as the step's port holds them (the
steps of talker.RowParams: a few launches of their own a call) and copies its code's row of an embedding table
into its row of an output (the code's embedding, the next input of the code predictor): the gather that would
be a launch of its own. With pdl (the plan's pdl knob) it launches with programmatic dependent launch (resources/pdl.py) and
reads nothing before the kernel before it ends.

tests/unit/test_select_triton.py runs it under Triton's interpreter on CPU, tests/gpu/test_select_gpu.py
compiled at the talker's shapes; select_ops.py makes it a torch operator.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from resources.pdl import _pdl_start, _pdl_wait, pdl_launch


@triton.jit
def _exp(x, PRECISE: tl.constexpr):
    """exp as torch's softmax takes it: libdevice's expf where compiled; tl.exp under the interpreter."""
    if PRECISE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _first_argmax(x, offs, BLOCK: tl.constexpr):
    """torch.argmax of a row: the first index among equal maxima (-0.0 equals +0.0; all -inf: 0)."""
    return tl.min(tl.where(x == tl.max(x, axis=0), offs, BLOCK), axis=0)


@triton.jit
def _order_keys(x, m):
    """u: the order-preserving image of each value in [0, 2^32 - 1) as uint32 (the radix sort's: negatives' bits
    reversed below positives', -0.0 taken as +0.0; +inf is 0xff800000); padding 2^32 - 1, above all."""
    b = tl.where(x == 0, 0, x.to(tl.int32, bitcast=True))
    return tl.where(m, tl.where(b < 0, ~b, b ^ -2147483648), -1).to(tl.uint32, bitcast=True)


@triton.jit
def _value_of(t):
    """The fp32 value a key u orders (_order_keys backwards; -0.0 comes back as +0.0)."""
    tb = t.to(tl.int32, bitcast=True)
    return tl.where(tb < 0, tb & 2147483647, ~tb).to(tl.float32, bitcast=True)


@triton.jit
def _kth_value(u, kth):
    """The sorted row's kth value: the largest u with count(u_i < u) <= kth, a bit a round, high to low, as
    the value it orders."""
    one = tl.full([], 1, tl.uint32)
    t = tl.zeros([], tl.uint32)
    for r in range(32):
        c = t | (one << (31 - r))
        t = tl.where(tl.sum((u < c).to(tl.int32), axis=0) <= kth, c, t)
    return _value_of(t)


@triton.jit
def _top_p_drop(u, p, m, offs, drop, floor, INDEX_BITS: tl.constexpr):
    """drop, and the ids top-p drops: the keys (u, index) below some t = (tu, ti), the largest key with
    sum(p_i : key_i < t) <= floor, in two searches; the top key never."""
    one = tl.full([], 1, tl.uint32)
    # tu = the largest u with sum(p_i : u_i < tu) <= floor (the sum over the same ids as at key (tu, 0), so
    # the same float). Below the least u top-k kept (lo) the sum is of zeros, and any tu above the top u drops
    # the same ids as top + 1, so the search takes only the bits below lo's and top + 1's common high bits
    # (the answer, or one above top, has them).
    top = tl.max(tl.where(m, u, 0), axis=0)
    hi = top + 1
    lo = tl.min(tl.where(drop, hi, u), axis=0)
    d = ((lo ^ hi).to(tl.float64).to(tl.int64, bitcast=True) >> 52) - 1023     # highest differing bit
    tu = lo & ~(tl.full([], 4294967295, tl.uint32) >> (31 - d).to(tl.uint32))      # bits above d
    for i in range(0, d + 1):
        c = tu | (one << (d - i).to(tl.uint32))
        tu = tl.where(tl.sum(tl.where(u < c, p, 0.0), axis=0) <= floor, c, tu)
    # ti orders the ids whose u is tu (ties: equal values); with fewer than two any ti drops the same ids
    ti = tl.zeros([], tl.int32)
    if tl.sum((u == tu).to(tl.int32), axis=0) > 1:
        for r in range(INDEX_BITS):
            c = ti | (1 << (INDEX_BITS - 1 - r))
            below = (u < tu) | ((u == tu) & (offs < c))
            ti = tl.where(tl.sum(tl.where(below, p, 0.0), axis=0) <= floor, c, ti)
    # cum at key_i (the sum over keys <= key_i) is <= floor exactly where key_i < t; the top key stays
    last = tl.max(tl.where(m & (u == top), offs, -1), axis=0)
    return drop | (((u < tu) | ((u == tu) & (offs < ti))) & (offs != last))


@triton.jit
def _is_sampled(sampled_ptr, temp_ptr, row, sa_st, t_st, RAW: tl.constexpr):
    """Whether the row samples: its sampled flag, or RAW (the sampling columns as given) a temperature above 0
    (a sampled row's temperature is then the column itself)."""
    if RAW:
        return tl.load(temp_ptr + row * t_st) > 0
    else:
        return tl.load(sampled_ptr + row * sa_st) != 0


@triton.jit
def _kth_of(kth_ptr, row, k_st, V, RAW: tl.constexpr):
    """The row's top-k position in the ascending sort; RAW, from its top_k column k (fp32): V - clamp(k, 1, V),
    0 (off) where k is not above 0, as talker.RowParams takes it."""
    if RAW:
        k = tl.load(kth_ptr + row * k_st)
        return tl.where(k > 0, V - tl.minimum(tl.maximum(k.to(tl.int64), 1), V), 0)
    else:
        return tl.load(kth_ptr + row * k_st)


@triton.jit
def _select(logits_ptr, sampled_ptr, temp_ptr, kth_ptr, floor_ptr, pen_ptr, noise_ptr, seen_ptr, sup_ptr, out_ptr,
            V, l_row, n_row, s_row, sa_st, t_st, k_st, f_st, p_st, HAS_SEEN: tl.constexpr, HAS_SUP: tl.constexpr,
            PRECISE: tl.constexpr, INDEX_BITS: tl.constexpr, BLOCK: tl.constexpr, emb_ptr, e_ptr, e_row, H,
            BLOCK_H: tl.constexpr, PDL: tl.constexpr = False, RAW: tl.constexpr = False):
    _pdl_start(PDL)
    _pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < V
    x = tl.load(logits_ptr + row * l_row + offs, mask=m, other=float("-inf")).to(tl.float32)
    if HAS_SEEN:                                   # repetition penalty: x * rp below zero, x / rp above
        rp = tl.load(pen_ptr + row * p_st)
        if RAW:                                    # a padding row's 0 reads as 1
            rp = tl.where(rp > 0, rp, 1.0)
        rp = tl.broadcast_to(rp, [BLOCK])
        seen = tl.load(seen_ptr + row * s_row + offs, mask=m, other=0) != 0
        x = tl.where(seen, tl.where(x < 0, x * rp, tl.math.div_rn(x, rp)), x)
    if HAS_SUP:
        x = tl.where(tl.load(sup_ptr + offs, mask=m, other=0) != 0, float("-inf"), x)
    code = _first_argmax(x, offs, BLOCK)           # greedy
    if _is_sampled(sampled_ptr, temp_ptr, row, sa_st, t_st, RAW):
        x = tl.math.div_rn(x, tl.broadcast_to(tl.load(temp_ptr + row * t_st), [BLOCK]))
        u = _order_keys(x, m)
        drop = offs < 0                            # nothing dropped yet
        kth = _kth_of(kth_ptr, row, k_st, V, RAW)
        if kth > 0:                                # top-k (kth 0: the smallest value, nothing is below it)
            drop = x < _kth_value(u, kth)
        xk = tl.where(drop, float("-inf"), x)
        e = _exp(xk - tl.max(xk, axis=0), PRECISE)
        p = tl.math.div_rn(e, tl.broadcast_to(tl.sum(e, axis=0), [BLOCK]))
        floor = tl.load(floor_ptr + row * f_st)
        if RAW:                                    # 1 - top_p; off (0): -1, no cumulative p is below it
            floor = tl.where(floor > 0, floor, -1.0)
        if floor >= 0:                             # top-p (off: floor -1, no cumulative p is below it)
            drop = _top_p_drop(u, p, m, offs, drop, floor, INDEX_BITS)
        log_e = tl.load(noise_ptr + row * n_row + offs, mask=m, other=0.0)
        code = _first_argmax(tl.where(drop, float("-inf"), x - log_e), offs, BLOCK)
    tl.store(out_ptr + row, code.to(tl.int64))
    if BLOCK_H > 1:                                # the code's embedding row
        h = tl.arange(0, BLOCK_H)
        tl.store(e_ptr + row * e_row + h, tl.load(emb_ptr + code.to(tl.int64) * H + h, mask=h < H), mask=h < H)


def warps(block: int) -> int:
    """The program's warps for a row of BLOCK ids."""
    return 8 if block >= 2048 else 4 if block >= 1024 else 1      # H200: 8 at 2048 17.7 us, 4 18.2, 2 24.7


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def select_codes(logits: torch.Tensor, sampled: torch.Tensor, temperature: torch.Tensor, kth: torch.Tensor,
                 floor: torch.Tensor, penalty: torch.Tensor | None, log_noise: torch.Tensor, seen: torch.Tensor | None,
                 suppress: torch.Tensor | None, out: torch.Tensor, num_warps: int | None = None,
                 embed: torch.Tensor | None = None, embed_out: torch.Tensor | None = None, pdl: bool = False,
                 raw: bool = False) -> None:
    """out [S] int64 = talker.select's codes. logits [S, V] (bf16 or fp32), log_noise [S, V] fp32, seen [S, V]
    bool or None (rows may be strided, columns contiguous), suppress [V] bool or None; per row (first dim,
    any stride): sampled bool, temperature fp32 (> 0), kth int64, floor fp32 (< 0: off), penalty fp32 (read
    only with seen); num_warps: the program's warps (None: warps(BLOCK)). embed [>= V, H] contiguous: embed_out
    [S, H] (columns contiguous) = embed[out]. pdl: launched with programmatic dependent launch. raw: temperature,
    kth, floor and penalty are the sampling columns as given, fp32 (talker.RowParams' steps taken in the
    program; sampled is not read)."""
    s, v = logits.shape
    if not s:
        return
    block = triton.next_power_of_2(v)
    has_seen, has_sup = seen is not None, suppress is not None
    pen = penalty if has_seen else temperature
    flags = temperature if raw else sampled.view(torch.uint8)          # raw: a row samples where its temperature > 0
    _select[(s,)](logits, flags, temperature, kth, floor, pen, log_noise,
                  seen.view(torch.uint8) if has_seen else logits, suppress.view(torch.uint8) if has_sup else logits,
                  out, v, logits.stride(0), log_noise.stride(0), seen.stride(0) if has_seen else 0, flags.stride(0),
                  temperature.stride(0), kth.stride(0), floor.stride(0), pen.stride(0), HAS_SEEN=has_seen,
                  HAS_SUP=has_sup, PRECISE=not _interpreted(), INDEX_BITS=block.bit_length() - 1, BLOCK=block,
                  num_warps=num_warps or warps(block), **_embedding(embed, embed_out, out), **pdl_launch(pdl, logits),
                  RAW=raw)


def _embedding(embed: torch.Tensor | None, embed_out: torch.Tensor | None, out: torch.Tensor) -> dict:
    """_select's arguments for the code's embedding row; without a table, out in the pointers' places (never
    read: BLOCK_H 1 compiles the copy away)."""
    if embed is None:
        return {"emb_ptr": out, "e_ptr": out, "e_row": 0, "H": 1, "BLOCK_H": 1}
    h = embed.shape[1]
    return {"emb_ptr": embed, "e_ptr": embed_out, "e_row": embed_out.stride(0), "H": h,
            "BLOCK_H": max(2, triton.next_power_of_2(h))}
