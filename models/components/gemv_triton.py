"""y = x @ W^T (+ b) for one row: a weight-streaming Triton kernel for decode steps (issue 13).

At one row a linear layer reads its whole weight to do almost no arithmetic, so its time is the weight's
bytes over the memory bandwidth. cuBLAS's kernels for Qwen3-Omni's one-row shapes on the H200 reach
0.25-2.5 TB/s (12.7 us for the code predictor's 4.2 MB o_proj; 4.1 TB/s only on the thinker's 623 MB
lm_head), and its split-K shapes add a reduce launch. Here each program owns BLOCK_N output columns and
streams their weight rows once, BLOCK_K columns a step, accumulating in fp32: 0.7-2.9 TB/s on the same
shapes, 4.5 on the lm_head, faster than cuBLAS on all 14 measured (examples/bench/bench_gemv.py,
docs/benchmarks.md). The sum over K is taken in BLOCK_K chunks (a different order from cuBLAS's; both
accumulate in fp32 and round once to the output dtype). One row only: a first version that carried up to
8 rows fell behind cuBLAS from 2-4 rows on the same shapes, where cuBLAS's time hardly grows with rows.

    gemv(x [1, K], weight [N, K], bias [N] or None, y [1, N])
    gemv_silu_mul(x [1, K], weight [2I, K], y [1, I])     a SwiGLU's gate_up product and its activation

    gemm_rows(x [M, K], weight [N, K], bias [N] or None, y [M, N])   2 <= M <= 64 rows, on the tensor cores
    norm_gemm_rows(x, residual, norm_weight, eps, weight, bias, total, y, swiglu)
                                                  gemm_rows (or its SwiGLU) of rms_norm(x (+ residual)) * norm_weight

gemv_silu_mul streams a SwiGLU's gate and up rows of the same columns in one program and writes
silu(gate) * up, rounded where the two launches it replaces round (the product's output, silu's, the
activation's: norm_triton._silu_mul), so a one-row MLP runs two launches, not three. gemv_ops.py makes both
torch operators; layers.Linear takes gemv where the plan says so (the gemv knob), layers.SwiGLU gemv_silu_mul
(the gemv_swiglu knob).

gemm_rows is the few-rows case (a decode step of 2-64 sequences): each program owns BLOCK_N output columns
and streams their weight rows once, BLOCK_K columns a step, multiplying the step's rows (padded to 16, the
tensor cores' least) on the tensor cores with fp32 accumulation; its grid is the columns only, so every
weight byte is read once whatever the rows. examples/bench/bench_gemv.py --rows measures it against cuBLAS.
norm_gemm_rows takes the RMSNorm before the product (and the residual add before the norm) into each program,
as norm_gemv does for one row, summing each row's squares over K in blocks; with swiglu it streams a SwiGLU's gate
and up rows of the same columns and stores silu(g) * u, rounded as gemv_silu_mul rounds it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.components.norm_triton import _residual_row, _rms_scaled, _round
from resources.pdl import _pdl_start, _pdl_wait, pdl_launch


@triton.jit
def _gemv(x_ptr, w_ptr, b_ptr, y_ptr, N, K, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          PDL: tl.constexpr = False):
    _pdl_start(PDL)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    cm = cols < N
    w = _tile(w_ptr, cols, cm, ks, K)           # the first block's weights, before the wait: they are constants
    _pdl_wait(PDL)
    acc = tl.sum(w * tl.load(x_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)[None, :], axis=1)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + ks
        x = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)                  # [BLOCK_K]
        acc += tl.sum(_tile(w_ptr, cols, cm, k, K) * x[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cm, other=0.0).to(tl.float32)
    tl.store(y_ptr + cols, acc.to(y_ptr.dtype.element_ty), mask=cm)


@triton.jit
def _tile(w_ptr, cols, cm, k, K):
    """Weight rows cols' columns k, [BLOCK_N, BLOCK_K] in fp32 (zeros outside N and K), streamed past the cache."""
    return tl.load(w_ptr + cols[:, None] * K + k[None, :], mask=cm[:, None] & (k < K)[None, :], other=0.0,
                   eviction_policy="evict_first").to(tl.float32)


@triton.jit
def _gemv_silu_mul(x_ptr, w_ptr, y_ptr, I, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   PDL: tl.constexpr = False):
    _pdl_start(PDL)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    cm = cols < I
    wg, wu = _tile(w_ptr, cols, cm, ks, K), _tile(w_ptr, cols + I, cm, ks, K)     # constants, before the wait
    _pdl_wait(PDL)
    x = tl.load(x_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)[None, :]
    g, u = tl.sum(wg * x, axis=1), tl.sum(wu * x, axis=1)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + ks
        x = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)[None, :]             # [1, BLOCK_K]
        g += tl.sum(_tile(w_ptr, cols, cm, k, K) * x, axis=1)
        u += tl.sum(_tile(w_ptr, cols + I, cm, k, K) * x, axis=1)
    _silu_mul_store(g, u, y_ptr, cols, cm)


@triton.jit
def _silu_mul_store(g, u, y_ptr, cols, cm):
    """y[cols] = silu(g) * u, rounded where the launches gemv_silu_mul replaces round."""
    BF16: tl.constexpr = y_ptr.dtype.element_ty == tl.bfloat16
    g, u = _round(g, BF16), _round(u, BF16)                  # the product's output in its dtype
    a = _round(g / (1.0 + tl.exp(-g)), BF16)
    tl.store(y_ptr + cols, _round(a * u, BF16).to(y_ptr.dtype.element_ty), mask=cm)


@triton.jit
def _norm_gemv(x_ptr, r_ptr, s_ptr, nw_ptr, w_ptr, b_ptr, y_ptr, N, K, eps, HAS_RES: tl.constexpr,
               HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               PDL: tl.constexpr = False):
    """gemv (SWIGLU: gemv_silu_mul, N = I) of rms_norm(x (+ r)) * nw, the norm taken by every program over the
    one row (K <= BLOCK_K) as norm_triton._rms_norm rounds it; with HAS_RES the sum x + r written to s by the
    first program."""
    _pdl_start(PDL)
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    cm = cols < N
    w = _tile(w_ptr, cols, cm, ks, K)                                    # constants, before the wait
    wu = _tile(w_ptr, cols + N, cm, ks, K) if SWIGLU else w
    nw = tl.load(nw_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
    _pdl_wait(PDL)
    _, _, x32 = _residual_row(x_ptr, r_ptr, s_ptr, 0, K, 0, 0, 0, HAS_RES, BLOCK_K, pid == 0)
    h = _rms_scaled(x32, nw, K, eps, x_ptr.dtype.element_ty == tl.bfloat16)[None, :]
    if SWIGLU:
        _silu_mul_store(tl.sum(w * h, axis=1), tl.sum(wu * h, axis=1), y_ptr, cols, cm)
    else:
        acc = tl.sum(w * h, axis=1)
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=cm, other=0.0).to(tl.float32)
        tl.store(y_ptr + cols, acc.to(y_ptr.dtype.element_ty), mask=cm)


@triton.jit
def _w_rows(w_ptr, cols, cm, k, km, K):
    """Weight rows cols' columns k, [BLOCK_N, BLOCK_K] in their dtype (zeros outside N and K), streamed past the
    cache."""
    return tl.load(w_ptr + cols[:, None] * K + k[None, :], mask=cm[:, None] & km[None, :], other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def _summed_rows(x_ptr, r_ptr, rows, rm, k, km, sxm, srm, HAS_RES: tl.constexpr):
    """The rows' columns k in fp32: x, or with HAS_RES x + r rounded to x's dtype as torch's add rounds it."""
    mask = rm[:, None] & km[None, :]
    x32 = tl.load(x_ptr + rows[:, None] * sxm + k[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        x32 = _round(x32 + tl.load(r_ptr + rows[:, None] * srm + k[None, :], mask=mask, other=0.0).to(tl.float32),
                     x_ptr.dtype.element_ty == tl.bfloat16)
    return x32


@triton.jit
def _rows_rstd(x_ptr, r_ptr, rows, rm, K, sxm, srm, eps, HAS_RES: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_K: tl.constexpr):
    """1 / rms of each row (of x + r with HAS_RES), summed over K in BLOCK_K steps: [BLOCK_M] fp32."""
    ks = tl.arange(0, BLOCK_K)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x32 = _summed_rows(x_ptr, r_ptr, rows, rm, k0 + ks, k0 + ks < K, sxm, srm, HAS_RES)
        ss += tl.sum(x32 * x32, axis=1)
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _rows_in(x_ptr, r_ptr, s_ptr, nw_ptr, rows, rm, M, k, km, sxm, srm, ssm, rstd, write, NORM: tl.constexpr,
             HAS_RES: tl.constexpr):
    """The product's input, the rows' columns k in the weight's dtype: x, or with NORM rms_norm(x (+ r)) * nw rounded
    as the norm's launch rounds it (with HAS_RES the sum x + r written to s where `write`)."""
    if NORM:
        x32 = _summed_rows(x_ptr, r_ptr, rows, rm, k, km, sxm, srm, HAS_RES)
        if HAS_RES:
            tl.store(s_ptr + rows[:, None] * ssm + k[None, :], x32.to(s_ptr.dtype.element_ty),
                     mask=(rows < tl.where(write, M, 0))[:, None] & km[None, :])
        BF16: tl.constexpr = x_ptr.dtype.element_ty == tl.bfloat16
        nw = tl.load(nw_ptr + k, mask=km, other=0.0).to(tl.float32)[None, :]
        h = _round(nw * _round(x32 * rstd, BF16), BF16)
    else:
        h = tl.load(x_ptr + rows[:, None] * sxm + k[None, :], mask=rm[:, None] & km[None, :], other=0.0)
    return h


@triton.jit
def _gemm_rows(x_ptr, r_ptr, s_ptr, nw_ptr, w_ptr, b_ptr, y_ptr, M, N, K, sxm, srm, ssm, sym, eps,
               NORM: tl.constexpr, HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """y = h @ w^T (+ b) for h the M rows of x, or with NORM rms_norm(x (+ r)) * nw, each program normalising the
    rows itself (h is never written; with HAS_RES the first program writes the sum x + r to s). SWIGLU: gate's
    columns cols and up's cols + N, silu(g) * u stored (N = I)."""
    _pdl_start(PDL)
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    cm, rm = cols < N, rows < M
    g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    _pdl_wait(PDL)
    if NORM:
        rstd = _rows_rstd(x_ptr, r_ptr, rows, rm, K, sxm, srm, eps, HAS_RES, BLOCK_M, BLOCK_K)[:, None]
    else:
        rstd = g
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        km = k < K
        h = _rows_in(x_ptr, r_ptr, s_ptr, nw_ptr, rows, rm, M, k, km, sxm, srm, ssm, rstd, pid == 0, NORM,
                     HAS_RES).to(w_ptr.dtype.element_ty)
        g = tl.dot(h, tl.trans(_w_rows(w_ptr, cols, cm, k, km, K)), g)
        if SWIGLU:
            u = tl.dot(h, tl.trans(_w_rows(w_ptr, cols + N, cm, k, km, K)), u)
    out, mask = rows[:, None] * sym + cols[None, :], rm[:, None] & cm[None, :]
    if SWIGLU:
        _silu_mul_store(g, u, y_ptr, out, mask)
    else:
        if HAS_BIAS:
            g += tl.load(b_ptr + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + out, g.to(y_ptr.dtype.element_ty), mask=mask)

def config(n: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) for an [n, k] weight, measured on the H200 (examples/bench/bench_gemv.py at 14
    decode shapes: 0.6% above the sum of each shape's best choice of 40, no shape more than 0.9 us above its
    own): two columns a program (one for the narrowest weights, a router's 128), the whole of K a step up
    to 4,096, with 8 warps from 2,048."""
    bk = min(4096, triton.next_power_of_2(k))
    return (1 if n <= 256 else 2), bk, (8 if bk >= 2048 else 4)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor,
         blocks: tuple[int, int, int] | None = None, pdl: bool = False) -> None:
    """y [1, N] = x [1, K] @ weight [N, K]^T (+ bias [N]); weight contiguous, x's and y's elements
    contiguous. blocks: (BLOCK_N, BLOCK_K, num_warps) to use (a sweep's). pdl: launched with programmatic
    dependent launch (resources/pdl.py): the first block of weights is read before the kernel before it ends."""
    n, k = weight.shape
    bn, bk, warps = blocks or config(n, k)
    _gemv[(triton.cdiv(n, bn),)](x, weight, weight if bias is None else bias, y, n, k, HAS_BIAS=bias is not None,
                                 BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, **pdl_launch(pdl, x))


def norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
              weight: torch.Tensor, bias: torch.Tensor | None, total: torch.Tensor | None, y: torch.Tensor,
              swiglu: bool = False, pdl: bool = False) -> None:
    """gemv (swiglu: gemv_silu_mul, no bias) of h = rms_norm(x (+ residual)) * norm_weight, x [1, K] with K at
    most one block (4,096): total = x + residual (where given), y [1, N] (swiglu: [1, N / 2]). Each program
    computes the norm; h is never written. pdl: as gemv's."""
    n, k = weight.shape
    bn, bk, warps = (1, *config(n, k)[1:]) if swiglu else config(n, k)
    if bk < k:
        raise ValueError(f"norm_gemv: K {k} exceeds one block ({bk}); the norm needs the whole row in a program")
    cols = n // 2 if swiglu else n
    has_res = residual is not None
    _norm_gemv[(triton.cdiv(cols, bn),)](x, residual if has_res else x, total if has_res else x, norm_weight,
                                         weight, weight if bias is None else bias, y, cols, k, eps, HAS_RES=has_res,
                                         HAS_BIAS=bias is not None, SWIGLU=swiglu, BLOCK_N=bn, BLOCK_K=bk,
                                         num_warps=warps, **pdl_launch(pdl, x))


def gemv_silu_mul(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor,
                  blocks: tuple[int, int, int] | None = None, pdl: bool = False) -> None:
    """y [1, I] = silu(g) * u, [g | u] = x [1, K] @ weight [2I, K]^T; weight contiguous, x's and y's elements
    contiguous. A program streams BLOCK_N columns' gate and up rows (as gemv's two rows a program at these widths).
    pdl: as gemv's."""
    n, k = weight.shape
    i = n // 2
    bn, bk, warps = blocks or (1, *config(n, k)[1:])
    _gemv_silu_mul[(triton.cdiv(i, bn),)](x, weight, y, i, k, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
                                          **pdl_launch(pdl, x))


def rows_config(k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) for gemm_rows over K columns: the best single choice of a sweep on an
    H100 (examples/bench/bench_gemv.py --rows; docs/benchmarks.md)."""
    return 16, min(256, max(16, triton.next_power_of_2(k))), 2, 4


def gemm_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor,
              blocks: tuple[int, int, int, int] | None = None, pdl: bool = False) -> None:
    """y [M, N] = x [M, K] @ weight [N, K]^T (+ bias [N]) for 1 <= M <= 64; weight contiguous, x's and y's rows
    with unit column stride. blocks: (BLOCK_N, BLOCK_K, num_warps, num_stages) to use (a sweep's). pdl: as gemv's."""
    _launch_rows(x, None, None, None, 0.0, weight, bias, y, False, blocks, pdl, "gemm_rows")


def norm_gemm_rows(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                   weight: torch.Tensor, bias: torch.Tensor | None, total: torch.Tensor | None, y: torch.Tensor,
                   swiglu: bool = False, pdl: bool = False) -> None:
    """gemm_rows (swiglu: silu(g) * u of [g | u] = h @ weight^T, no bias) of h = rms_norm(x (+ residual)) *
    norm_weight, x [M, K], 1 <= M <= 64: total = x + residual (where given), y [M, N] (swiglu: [M, N / 2]). Each
    program normalises the rows; h is never written. pdl: as gemv's."""
    _launch_rows(x, residual, total, norm_weight, eps, weight, bias, y, swiglu, None, pdl, "norm_gemm_rows")


def _launch_rows(x, residual, total, norm_weight, eps, weight, bias, y, swiglu, blocks, pdl, what: str) -> None:
    """_gemm_rows over the columns (a SwiGLU's half of the weight's rows), normed where norm_weight is given."""
    m, k = x.shape
    if not 1 <= m <= 64:
        raise ValueError(f"{what}: {m} rows; it takes 1 to 64 (more rows are a GEMM: use torch.mm)")
    cols = weight.shape[0] // (2 if swiglu else 1)
    bn, bk, warps, stages = blocks or rows_config(k)
    r, t = (residual, total) if residual is not None else (x, x)
    _gemm_rows[(triton.cdiv(cols, bn),)](x, r, t, x if norm_weight is None else norm_weight, weight,
                                         weight if bias is None else bias, y, m, cols, k, x.stride(0), r.stride(0),
                                         t.stride(0), y.stride(0), eps, NORM=norm_weight is not None,
                                         HAS_RES=residual is not None, HAS_BIAS=bias is not None, SWIGLU=swiglu,
                                         BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=bn, BLOCK_K=bk,
                                         num_warps=warps, num_stages=stages, **pdl_launch(pdl, x))
