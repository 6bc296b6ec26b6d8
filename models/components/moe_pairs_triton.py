"""A few tokens' MoE experts, one token-expert pair at a time (issue 37): weight-streaming Triton kernels for
decode steps, in place of moe_triton's grouped kernels there.

moe_triton's _gate_up and _down launch a program per (expert, N-block) for all E experts; at one token only k of
them have a pair, so the thinker's gate_up launches 3,072 programs of which 192 read weights, and those 192 fill
1.5 waves of an H100's 132 SMs. Here a program per (pair, N-block): every program streams one expert's rows of
BLOCK_N output columns once, the whole of K in BLOCK_K steps, as gemv_triton does for a dense layer's one row.
No grouping is needed: a pair's expert is read from the router's output. A pair reads its expert's weights
itself, so a step whose tokens share an expert reads it once per pair (the grouped kernels read it once per
step): the plan takes these kernels only for steps of few tokens (Experts.moe_pair_tokens).

    gate_up(x [T, H], gate_up_proj [E, 2I, H], experts [T k], h [T k, I])     silu(x W_gate) * (x W_up)
    down(h [T k, I], down_proj [E, H, I], experts [T k], weights [T k], pairs [T k, H])   weight x (h W_down)

Both accumulate in fp32 and round once, as moe_triton's tiles do (h = silu(g) * u from the fp32 sums; the down
product times the routing weight, rounded once); the sums over K run in another order than tl.dot's. Runs
under TRITON_INTERPRET=1 on CPU (tests/unit/test_moe_pairs_triton.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.components.moe_triton import _gate_up_rows
from resources.pdl import _pdl_start, _pdl_wait, pdl_launch


@triton.jit
def _pair_gate_up(x_ptr, w_ptr, ex_ptr, h_ptr, I, H: tl.constexpr, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, ILV: tl.constexpr, PDL: tl.constexpr = False):
    """Program (pair j, N-block): h[j, n] = silu(g) * u over the BLOCK_N columns n, g and u the dot products of
    pair j's token with its expert's gate and up rows of column n. With PDL it waits first: the pair's expert is
    the router's output."""
    _pdl_start(PDL)
    _pdl_wait(PDL)
    j = tl.program_id(0)
    e = tl.load(ex_ptr + j).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < I
    row_g, row_u = _gate_up_rows(offs_n, I, ILV)
    w_e = w_ptr + e * (2 * I * H)
    x_row = x_ptr + (j // TOP_K).to(tl.int64) * H
    acc_g = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < H
        m = n_mask[:, None] & k_mask[None, :]
        xk = tl.load(x_row + offs_k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        wg = tl.load(w_e + row_g[:, None] * H + offs_k[None, :], mask=m, other=0.0, eviction_policy="evict_first")
        wu = tl.load(w_e + row_u[:, None] * H + offs_k[None, :], mask=m, other=0.0, eviction_policy="evict_first")
        acc_g += tl.sum(wg.to(tl.float32) * xk, axis=1)
        acc_u += tl.sum(wu.to(tl.float32) * xk, axis=1)
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(h_ptr + j.to(tl.int64) * I + offs_n, h.to(h_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _pair_down(h_ptr, w_ptr, ex_ptr, scale_ptr, out_ptr, H, I: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """Program (pair j, N-block): out[j, n] = scale[j] x (h[j] . its expert's down row n), for BLOCK_N rows n."""
    _pdl_start(PDL)
    _pdl_wait(PDL)
    j = tl.program_id(0)
    e = tl.load(ex_ptr + j).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < H
    w_e = w_ptr + e * (H * I)
    h_row = h_ptr + j.to(tl.int64) * I
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < I
        hk = tl.load(h_row + offs_k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        wd = tl.load(w_e + offs_n[:, None] * I + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0,
                     eviction_policy="evict_first")
        acc += tl.sum(wd.to(tl.float32) * hk, axis=1)
    y = acc * tl.load(scale_ptr + j).to(tl.float32)
    tl.store(out_ptr + j.to(tl.int64) * H + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_mask)


# (BLOCK_N, BLOCK_K, warps) of each kernel for layers of hidden size at least each key (the largest key that
# applies), the K step cut to the weight's K (H for gate_up, I for down). On an H100 (examples/bench/
# bench_moe_pairs.py: 9 choices a kernel at 1, 2 and 4 tokens, docs/benchmarks.md) each is the best choice or
# within 1% of it, at the thinker's shape (hidden 2,048) and at the talker's (1,024).
BLOCKS = {"gate_up": {0: (2, 1024, 4), 2048: (2, 2048, 8)}, "down": {0: (16, 128, 4), 2048: (4, 1024, 4)}}


def _blocks(kind: str, hidden: int, k: int) -> tuple[int, int, int]:
    """BLOCKS[kind] for a layer of this hidden size and a weight of K columns k."""
    bn, bk, warps = BLOCKS[kind][max(key for key in BLOCKS[kind] if key <= hidden)]
    return bn, min(bk, max(16, triton.next_power_of_2(k))), warps


def gate_up(x: torch.Tensor, gate_up_proj: torch.Tensor, experts: torch.Tensor, h: torch.Tensor, top_k: int,
            interleave: int = 0, pdl: bool = False) -> None:
    """h [P, I] (P = T k, pair order) = silu(x W_gate) * (x W_up) of each pair's token (pair // top_k) and expert
    (experts [P]); gate_up_proj's rows as Experts.gate_up_layout says (`interleave`). pdl: launched with
    programmatic dependent launch (resources/pdl.py)."""
    _, two_i, hidden = gate_up_proj.shape
    p, i = experts.numel(), two_i // 2
    bn, bk, warps = _blocks("gate_up", hidden, hidden)
    if p:
        _pair_gate_up[(p, triton.cdiv(i, bn))](x, gate_up_proj, experts, h, i, H=hidden, TOP_K=top_k, BLOCK_N=bn,
                                               BLOCK_K=bk, ILV=interleave, num_warps=warps, **pdl_launch(pdl, x))


def down(h: torch.Tensor, down_proj: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
         pairs: torch.Tensor, pdl: bool = False) -> None:
    """pairs [P, H] (pair order) = weights[j] x (h[j] W_down of experts[j]), for P = T k pairs. pdl: as gate_up's."""
    _, hidden, inter = down_proj.shape
    p = experts.numel()
    bn, bk, warps = _blocks("down", hidden, inter)
    if p:
        _pair_down[(p, triton.cdiv(hidden, bn))](h, down_proj, experts, weights, pairs, hidden, I=inter, BLOCK_N=bn,
                                                 BLOCK_K=bk, num_warps=warps, **pdl_launch(pdl, h))
