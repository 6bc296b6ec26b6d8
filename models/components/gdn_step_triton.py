"""The Gated DeltaNet layer's elementwise work around its delta rule, one Triton launch each: a decode step's
causal conv on the conv state pool in place (and any step's, rows of several sequences), and the gates of any
step.

    conv_row   each sequence's one new row through the depthwise causal conv: its window [C, K-1] read from
               pool[slot] (zeros where has_state is False, whatever the slot holds), y = silu(sum over the K taps
               of [window | row] * w) in fp32 and rounded once to the row's dtype, and the window shifted by the
               row written back to pool[slot] in place. The torch path (GatedDeltaNet.conv: read_slots, causal_conv's
               one-row branch, index_copy_) is about thirteen launches. A program per (block of BLOCK_C channels,
               sequence); the slot ids and has_state flags are the step's static tensors, so a captured graph
               replays it with no host work.
    conv_rows  any step's conv (prefill chunks and decode rows of several sequences): each row's taps read the
               rows before it in its sequence and, before its first row, the sequence's window in its slot;
               then each sequence's last K-1 rows (with its old window where it brought fewer) become its
               window. The torch path (causal_conv's many-row branch) gathers a [T, K, C] fp32 copy of the rows
               and their windows; this reads the rows once and writes the outputs and windows. Two launches
               (the windows are rewritten only after every row has read them).
    gates      beta = sigmoid(b) rounded to b's dtype, g = -exp(A_log) * softplus(a + dt_bias) in fp32 (HF's
               Qwen3_5GatedDeltaNet; torch's softplus: a past 20 passes through), a program per row (torch: about
               nine launches).

Both round where the torch path rounds (the window cast to the row's dtype, as causal_conv casts it; the new
window cast to it, then to the pool's), with norm_triton._round (the interpreter casts by truncation). Only
the taps' summation order and the transcendental functions' last bits differ. norm_ops.py makes them torch
operators; tests/unit/test_gdn_fused_triton.py runs them under Triton's interpreter on CPU against the torch
path, tests/gpu/test_gdn_fused_gpu.py at Qwen3.5-9B's shapes on the GPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.components.norm_triton import _round

BLOCK_C = 256       # channels a conv program owns (not measured: the 9B's 8,192 channels are 32 programs a row)


@triton.jit
def _conv_row(x_ptr, w_ptr, pool_ptr, slots_ptr, has_ptr, y_ptr, C, x_row, w_row, y_row, sps, spc, spk,
              K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr):
    n = tl.program_id(1)
    c = tl.program_id(0) * BC + tl.arange(0, BC)
    j = tl.arange(0, BK)                         # taps: j < K - 1 the window's rows (oldest first), K - 1 the row
    mc = c < C
    X_BF16: tl.constexpr = x_ptr.dtype.element_ty == tl.bfloat16
    slot = tl.load(slots_ptr + n).to(tl.int64)
    keep = tl.load(has_ptr + n).to(tl.int32)
    win_ptr = pool_ptr + slot * sps + c[:, None] * spc + j[None, :] * spk
    win = tl.load(win_ptr, mask=mc[:, None] & (j < K - 1)[None, :], other=0.0).to(tl.float32)
    win = _round(tl.where(keep != 0, win, 0.0), X_BF16)                     # windows.to(x.dtype)
    row = tl.load(x_ptr + n.to(tl.int64) * x_row + c, mask=mc, other=0.0).to(tl.float32)
    ext = tl.where((j == K - 1)[None, :], row[:, None], win)               # [BC, BK]
    w = tl.load(w_ptr + c[:, None] * w_row + j[None, :], mask=mc[:, None] & (j < K)[None, :], other=0.0)
    acc = tl.sum(ext * w.to(tl.float32), axis=1)
    y = _round(acc / (1.0 + tl.exp(-acc)), y_ptr.dtype.element_ty == tl.bfloat16)
    tl.store(y_ptr + n.to(tl.int64) * y_row + c, y.to(y_ptr.dtype.element_ty), mask=mc)
    shifted = _round(ext, pool_ptr.dtype.element_ty == tl.bfloat16)         # taps 1..K-1 into rows 0..K-2
    tl.store(win_ptr - spk, shifted.to(pool_ptr.dtype.element_ty), mask=mc[:, None] & ((j >= 1) & (j < K))[None, :])


def conv_row(x: torch.Tensor, weight: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor, has_state: torch.Tensor,
             y: torch.Tensor) -> None:
    """x, y [N, C] (rows may be strided, channels contiguous), weight [C, K] (taps contiguous), pool [slots, C,
    K-1] (any strides), slots [N] int64, has_state [N] bool: y = silu(conv([pool[slot] | x], weight)), the windows
    advanced in pool."""
    n, c = x.shape
    k = weight.shape[1]
    if n and c:
        bc = min(BLOCK_C, triton.next_power_of_2(c))
        _conv_row[(triton.cdiv(c, bc), n)](x, weight, pool, slots, has_state, y, c, x.stride(0), weight.stride(0),
                                           y.stride(0), pool.stride(0), pool.stride(1), pool.stride(2), K=k,
                                           BK=triton.next_power_of_2(k), BC=bc, num_warps=2)


@triton.jit
def _conv_rows(x_ptr, w_ptr, pool_ptr, slots_ptr, has_ptr, seq_ptr, cu_ptr, y_ptr, C, x_row, w_row, y_row, sps, spc,
               spk, K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr):
    """Row t's conv: tap j reads row t - (K-1) + j where that row is its sequence's, else the sequence's window
    (zeros without a state), rounded to the rows' dtype."""
    t = tl.program_id(1).to(tl.int64)
    c = tl.program_id(0) * BC + tl.arange(0, BC)
    j = tl.arange(0, BK)
    mc = c < C
    X_BF16: tl.constexpr = x_ptr.dtype.element_ty == tl.bfloat16
    s = tl.load(seq_ptr + t).to(tl.int64)
    first = tl.load(cu_ptr + s).to(tl.int64)
    slot = tl.load(slots_ptr + s).to(tl.int64)
    keep = tl.load(has_ptr + s).to(tl.int32)
    p = t - (K - 1) + j                                                     # each tap's row
    own = (p >= first) & (j < K)
    xv = tl.load(x_ptr + p[None, :] * x_row + c[:, None], mask=mc[:, None] & own[None, :], other=0.0)
    widx = K - 1 - first + p                                                # the window's row, where p < first
    win = tl.load(pool_ptr + slot * sps + c[:, None] * spc + widx[None, :] * spk,
                  mask=mc[:, None] & ((p < first) & (j < K))[None, :], other=0.0).to(tl.float32)
    win = _round(tl.where(keep != 0, win, 0.0), X_BF16)                     # windows.to(x.dtype)
    ext = tl.where(own[None, :], xv.to(tl.float32), win)                    # [BC, BK]
    w = tl.load(w_ptr + c[:, None] * w_row + j[None, :], mask=mc[:, None] & (j < K)[None, :], other=0.0)
    acc = tl.sum(ext * w.to(tl.float32), axis=1)
    y = _round(acc / (1.0 + tl.exp(-acc)), y_ptr.dtype.element_ty == tl.bfloat16)
    tl.store(y_ptr + t * y_row + c, y.to(y_ptr.dtype.element_ty), mask=mc)


@triton.jit
def _conv_windows(x_ptr, pool_ptr, slots_ptr, has_ptr, cu_ptr, C, x_row, sps, spc, spk, K: tl.constexpr,
                  BK: tl.constexpr, BC: tl.constexpr):
    """Sequence n's new window: the last K-1 rows of [its window | its rows], into its slot."""
    n = tl.program_id(1)
    c = tl.program_id(0) * BC + tl.arange(0, BC)
    i = tl.arange(0, BK)
    mc = c < C
    X_BF16: tl.constexpr = x_ptr.dtype.element_ty == tl.bfloat16
    first = tl.load(cu_ptr + n).to(tl.int64)
    end = tl.load(cu_ptr + n + 1).to(tl.int64)
    slot = tl.load(slots_ptr + n).to(tl.int64)
    keep = tl.load(has_ptr + n).to(tl.int32)
    p = end - (K - 1) + i                                                   # window row i's source row
    own = (p >= first) & (i < K - 1)
    xv = tl.load(x_ptr + p[None, :] * x_row + c[:, None], mask=mc[:, None] & own[None, :], other=0.0)
    widx = K - 1 - first + p
    base = pool_ptr + slot * sps + c[:, None] * spc
    win = tl.load(base + widx[None, :] * spk, mask=mc[:, None] & ((p < first) & (i < K - 1))[None, :],
                  other=0.0).to(tl.float32)
    new = tl.where(own[None, :], xv.to(tl.float32), _round(tl.where(keep != 0, win, 0.0), X_BF16))
    new = _round(new, pool_ptr.dtype.element_ty == tl.bfloat16)
    tl.store(base + i[None, :] * spk, new.to(pool_ptr.dtype.element_ty), mask=mc[:, None] & (i < K - 1)[None, :])


def conv_rows(x: torch.Tensor, weight: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor, has_state: torch.Tensor,
              seq: torch.Tensor, cu: torch.Tensor, y: torch.Tensor) -> None:
    """Any step's causal conv (delta_rule.causal_conv) on the conv state pool in place: x, y [T, C] (rows may be
    strided, channels contiguous), weight [C, K], pool [slots, C, K-1], per sequence slots [N] int64, has_state
    [N] bool and cu [N+1] (its rows cu[n]:cu[n+1]), per row seq [T] (its sequence). Two launches: every row's
    output from the windows as they were, then each sequence's new window into its slot."""
    t, c = x.shape
    k, n = weight.shape[1], slots.shape[0]
    if t and c:
        bc = min(BLOCK_C, triton.next_power_of_2(c))
        bk = triton.next_power_of_2(k)
        strides = (pool.stride(0), pool.stride(1), pool.stride(2))
        _conv_rows[(triton.cdiv(c, bc), t)](x, weight, pool, slots, has_state, seq, cu, y, c, x.stride(0),
                                            weight.stride(0), y.stride(0), *strides, K=k, BK=bk, BC=bc, num_warps=2)
        _conv_windows[(triton.cdiv(c, bc), n)](x, pool, slots, has_state, cu, c, x.stride(0), *strides, K=k, BK=bk,
                                               BC=bc, num_warps=2)


@triton.jit
def _softplus(x):
    """torch's softplus (beta 1, threshold 20): x past 20, else log1p(exp(x)), log1p as log(u) * e / (u - 1) with
    u = 1 + e (exact to a few ulps where u rounds; e itself where u rounds to 1)."""
    e = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + e
    lp = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
    return tl.where(x > 20.0, x, lp)


@triton.jit
def _gates(b_ptr, a_ptr, alog_ptr, dt_ptr, beta_ptr, g_ptr, HV, b_row, a_row, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < HV
    b = tl.load(b_ptr + row * b_row + offs, mask=m, other=0.0).to(tl.float32)
    beta = _round(1.0 / (1.0 + tl.exp(-b)), beta_ptr.dtype.element_ty == tl.bfloat16)
    tl.store(beta_ptr + row * HV + offs, beta.to(beta_ptr.dtype.element_ty), mask=m)
    a = tl.load(a_ptr + row * a_row + offs, mask=m, other=0.0).to(tl.float32)
    a = a + tl.load(dt_ptr + offs, mask=m, other=0.0).to(tl.float32)
    decay = -tl.exp(tl.load(alog_ptr + offs, mask=m, other=0.0).to(tl.float32))
    tl.store(g_ptr + row * HV + offs, decay * _softplus(a), mask=m)


def gates(b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, beta: torch.Tensor,
          g: torch.Tensor) -> None:
    """b, a [N, HV] (rows may be strided, heads contiguous), a_log and dt_bias [HV]; beta [N, HV] in b's dtype and
    g [N, HV] fp32, both contiguous: beta = sigmoid(b), g = -exp(a_log) * softplus(a + dt_bias)."""
    n, hv = b.shape
    if n:
        _gates[(n,)](b, a, a_log, dt_bias, beta, g, hv, b.stride(0), a.stride(0), BLOCK=triton.next_power_of_2(hv),
                     num_warps=1)
