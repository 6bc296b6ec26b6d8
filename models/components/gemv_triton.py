"""y = x @ W^T (+ b) for a few rows: a weight-streaming Triton kernel for decode steps (issue 13).

At one to a few rows a linear layer reads its whole weight to do almost no arithmetic, so its time is the
weight's bytes over the memory bandwidth. cuBLAS's kernels for these shapes on the H200 reach 1.2-1.6 TB/s
of the 4.3 a copy reaches (measured in a captured talker step: 10.2 us for the code predictor's 12.6 MB
gate/up projection), and its split-K shapes add a second reduce launch. Here each program owns BLOCK_N
output columns of every row and streams their weight rows once, BLOCK_K columns at a time, accumulating in
fp32. The sum over K is taken in BLOCK_K chunks (a different order from cuBLAS's; both accumulate in
fp32 and round once to the output dtype). One row only: with more rows this kernel fell behind cuBLAS
(at 4 rows 1.1-3x slower on the same shapes, examples/bench_gemv.py), where cuBLAS's time hardly grows.

    gemv(x [1, K], weight [N, K], bias [N] or None, y [1, N])

gemv_ops.py makes it a torch operator; layers.Linear takes it where the plan says so (the gemv knob).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gemv(x_ptr, w_ptr, b_ptr, y_ptr, N, K, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    cm = cols < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        km = k < K
        w = tl.load(w_ptr + cols[:, None] * K + k[None, :], mask=cm[:, None] & km[None, :], other=0.0,
                    eviction_policy="evict_first").to(tl.float32)                     # [BLOCK_N, BLOCK_K]
        x = tl.load(x_ptr + k, mask=km, other=0.0).to(tl.float32)                      # [BLOCK_K]
        acc += tl.sum(w * x[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cm, other=0.0).to(tl.float32)
    tl.store(y_ptr + cols, acc.to(y_ptr.dtype.element_ty), mask=cm)


def config(n: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) for an [n, k] weight; measured on the H200 (examples/bench_gemv.py):
    BLOCK_N = 1 column per program for the narrowest weights up to 8 for the widest (about 500-1,300
    programs where the weight allows), BLOCK_K = 1,024."""
    bn = 1 if n <= 256 else 2 if n <= 3072 else 4 if n <= 8192 else 8
    return bn, min(1024, triton.next_power_of_2(k)), 4


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor,
         blocks: tuple[int, int, int] | None = None) -> None:
    """y [1, N] = x [1, K] @ weight [N, K]^T (+ bias [N]); weight contiguous, x's and y's elements
    contiguous. blocks: (BLOCK_N, BLOCK_K, num_warps) to use (a sweep's)."""
    n, k = weight.shape
    bn, bk, warps = blocks or config(n, k)
    _gemv[(triton.cdiv(n, bn),)](x, weight, weight if bias is None else bias, y, n, k, HAS_BIAS=bias is not None,
                                 BLOCK_N=bn, BLOCK_K=bk, num_warps=warps)
