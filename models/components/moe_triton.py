"""Fused MoE experts for small token counts (issue 13): two Triton kernels in place of the grouped GEMMs
and the gathers, scatters and elementwise kernels around them.

Experts.forward's bf16 path runs, per layer: sort, arange, searchsorted, index_select of the rows,
grouped_mm (gate and up), silu, mul, grouped_mm (down), index_select of the weights, mul, a scatter
and a sum. Here four launches:

    group     one small kernel: the token-expert pairs grouped by expert (each pair's rank by expert,
              then by index) and the end of each expert's group; its work grows as the pairs squared, so
              steps of many pairs take count + place instead, a counting sort in two launches (each
              block's pairs per expert, then each pair's rank from those counts and its block)

    gate_up   grid (experts, I / BLOCK_N): the program of expert e reads its gate and up rows of one
              N-block once, for every pair routed to e (BLOCK_M at a time, the rows gathered by token
              from x in the kernel), and writes silu(gate) * up, accumulated in fp32 and rounded once
    down      grid (experts, H / BLOCK_N): the same over down_proj, each pair's row scaled by its routing
              weight and written to its (token, slot) place
    sum       the k slots of each token: torch's sum

An expert no pair chose costs its programs a load of two offsets. Weights are read once per step for
each expert chosen (the bandwidth floor), where the per-pair batched path reads them once per pair.
The math is Experts.forward's; the roundings differ (fp32 through silu * up and through the
weighting, rounded once where the reference rounds after each op): tests/gpu compares both with an
fp32 reference at the thinker's and the talker's real shapes. Runs under TRITON_INTERPRET=1 on CPU
(tests/unit/test_moe_triton.py). moe_ops.py makes them torch operators; moe_ops.fused_experts is
the whole layer.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.components.moe_sort import count_blocks
from resources.pdl import _pdl_start, _pdl_wait, pdl_launch


@triton.jit
def _group(ex_ptr, rows_ptr, ends_ptr, P, E: tl.constexpr, BLOCK: tl.constexpr, EBLOCK: tl.constexpr):
    """The pairs grouped by expert: rows[r] = the pair of rank r (by expert, then by pair index), and
    ends[e] = the pairs whose expert is <= e. Program b ranks pairs [b*BLOCK, (b+1)*BLOCK) against all P;
    program 0 also counts the ends."""
    pid = tl.program_id(0)
    offs_i = pid * BLOCK + tl.arange(0, BLOCK)
    mi = offs_i < P
    ei = tl.load(ex_ptr + offs_i, mask=mi, other=0)
    rank = tl.zeros([BLOCK], dtype=tl.int32)
    j0 = 0
    while j0 < P:
        offs_j = j0 + tl.arange(0, BLOCK)
        ej = tl.load(ex_ptr + offs_j, mask=offs_j < P, other=E)          # past the end: after every expert
        before = (ej[None, :] < ei[:, None]) | ((ej[None, :] == ei[:, None]) & (offs_j[None, :] < offs_i[:, None]))
        rank += tl.sum(before.to(tl.int32), axis=1)
        j0 += BLOCK
    tl.store(rows_ptr + rank, offs_i, mask=mi)
    if pid == 0:
        offs_e = tl.arange(0, EBLOCK)
        count = tl.zeros([EBLOCK], dtype=tl.int32)
        j0 = 0
        while j0 < P:
            offs_j = j0 + tl.arange(0, BLOCK)
            ej = tl.load(ex_ptr + offs_j, mask=offs_j < P, other=E)
            count += tl.sum((ej[None, :] <= offs_e[:, None]).to(tl.int32), axis=1)
            j0 += BLOCK
        tl.store(ends_ptr + offs_e, count, mask=offs_e < E)


@triton.jit
def _count(ex_ptr, counts_ptr, P, E: tl.constexpr, BLOCK: tl.constexpr, SUB: tl.constexpr, EBLOCK: tl.constexpr):
    """Many pairs grouped by a counting sort, launch 1 of 2: counts[b, e] = the pairs of block b
    ([b*BLOCK, (b+1)*BLOCK)) whose expert is e, SUB pairs at a time."""
    b = tl.program_id(0)
    offs_e = tl.arange(0, EBLOCK)
    count = tl.zeros([EBLOCK], dtype=tl.int32)
    for i0 in range(0, BLOCK, SUB):
        offs = b * BLOCK + i0 + tl.arange(0, SUB)
        ex = tl.load(ex_ptr + offs, mask=offs < P, other=-1)            # past the end: no expert
        count += tl.sum((ex[:, None] == offs_e[None, :]).to(tl.int32), axis=0)
    tl.store(counts_ptr + b * E + offs_e, count, mask=offs_e < E)


@triton.jit
def _place(ex_ptr, counts_ptr, rows_ptr, ends_ptr, P, NB, MAX_TILES, E: tl.constexpr, BLOCK: tl.constexpr,
           SUB: tl.constexpr, EBLOCK: tl.constexpr, NBLOCK: tl.constexpr, TILE: tl.constexpr, TBLOCK: tl.constexpr):
    """Launch 2 of 2: each pair of block b to its rank by (expert, pair index), as _group orders them:
    rows[rank] = the pair. Its rank = the pairs of lower experts (all blocks) + the pairs of its expert in
    blocks before b + those before it in b (counted SUB x SUB at a time). Program 0 also writes
    ends[e] = the pairs whose expert is <= e.

    With TILE > 0 (the SM90 grouped GEMMs' maps, moe_sm90.py) each expert's pairs start at a multiple of TILE
    (its group padded to whole tiles): rows[padded rank] = the pair, and the programs write, for each of the
    MAX_TILES tiles t (TBLOCK at a time, dealt round the programs), ends[t] = the expert of tile t,
    ends[MAX_TILES + t] = the end of that expert's pairs in padded rows (tiles past the last: expert 0, end 0),
    and program 0 ends[2 MAX_TILES] = the tiles in use."""
    b = tl.program_id(0)
    offs_e = tl.arange(0, EBLOCK)
    offs_b = tl.arange(0, NBLOCK)
    counts = tl.load(counts_ptr + offs_b[:, None] * E + offs_e[None, :],
                     mask=(offs_b[:, None] < NB) & (offs_e[None, :] < E), other=0)
    total = tl.sum(counts, axis=0)                                      # [EBLOCK] pairs per expert
    if TILE > 0:
        ntiles = (total + TILE - 1) // TILE
        tiles_upto = tl.cumsum(ntiles, axis=0)                          # tiles of experts <= e
        start = (tiles_upto - ntiles) * TILE                            # each expert's first padded row
    else:
        upto = tl.cumsum(total, axis=0)
        start = upto - total
    base = start + tl.sum(tl.where(offs_b[:, None] < b, counts, 0), axis=0)
    for i0 in range(0, BLOCK, SUB):
        offs = b * BLOCK + i0 + tl.arange(0, SUB)
        m = offs < P
        ex = tl.load(ex_ptr + offs, mask=m, other=-1)
        rank = tl.sum(tl.where(ex[:, None] == offs_e[None, :], base[None, :], 0), axis=1)
        for j0 in range(0, i0 + SUB, SUB):
            offs_j = b * BLOCK + j0 + tl.arange(0, SUB)
            ej = tl.load(ex_ptr + offs_j, mask=offs_j < P, other=-1)
            before = (ej[None, :] == ex[:, None]) & (offs_j[None, :] < offs[:, None])
            rank += tl.sum(before.to(tl.int32), axis=1)
        tl.store(rows_ptr + rank, offs, mask=m)
    if TILE > 0:                    # the tiles' maps, TBLOCK tiles at a time, dealt over the NB programs
        limit = start + total
        for t0 in range(b * TBLOCK, MAX_TILES, NB * TBLOCK):
            offs_t = t0 + tl.arange(0, TBLOCK)
            e_t = tl.sum((tiles_upto[None, :] <= offs_t[:, None]).to(tl.int32), axis=1)   # past the last: E
            lim = tl.sum(tl.where(offs_e[None, :] == e_t[:, None], limit[None, :], 0), axis=1)
            mt = offs_t < MAX_TILES
            tl.store(ends_ptr + offs_t, tl.where(e_t < E, e_t, 0), mask=mt)
            tl.store(ends_ptr + MAX_TILES + offs_t, lim, mask=mt)
        if b == 0:
            tl.store(ends_ptr + 2 * MAX_TILES, tl.sum(ntiles, axis=0))
    elif b == 0:
        tl.store(ends_ptr + offs_e, upto, mask=offs_e < E)


@triton.jit
def _gate_up_rows(offs_n, I: tl.constexpr, ILV: tl.constexpr):
    """The weight rows of gate column n and up column n: gate rows then up rows (ILV 0), or up and gate
    interleaved ILV rows at a time, up first (the SM90 grouped GEMM's layout, Experts.gate_up_layout)."""
    if ILV > 0:
        up = (offs_n // ILV) * (2 * ILV) + offs_n % ILV
        return up + ILV, up
    return offs_n, offs_n + I


@triton.jit
def _gate_up_tile(x_ptr, w_e, h_ptr, rows_ptr, offs_m, m_mask, offs_n, n_mask, H: tl.constexpr, I: tl.constexpr,
                  TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  ILV: tl.constexpr):
    """One tile: grouped rows offs_m (pairs of one expert, whose weights start at w_e) x N-block offs_n of
    silu(x W_gate) * (x W_up), accumulated in fp32 and rounded once into h."""
    tok = tl.load(rows_ptr + offs_m, mask=m_mask, other=0) // TOP_K
    row_g, row_u = _gate_up_rows(offs_n, I, ILV)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < H
        xa = tl.load(x_ptr + tok[:, None].to(tl.int64) * H + offs_k[None, :],
                     mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        wk = k_mask[:, None] & n_mask[None, :]
        wg = tl.load(w_e + row_g[None, :] * H + offs_k[:, None], mask=wk, other=0.0)
        wu = tl.load(w_e + row_u[None, :] * H + offs_k[:, None], mask=wk, other=0.0)
        acc_g += tl.dot(xa, wg)
        acc_u += tl.dot(xa, wu)
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(h_ptr + offs_m[:, None].to(tl.int64) * I + offs_n[None, :], h.to(h_ptr.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _down_tile(h_ptr, w_e, out_ptr, rows_ptr, scale_ptr, offs_m, m_mask, offs_n, n_mask, H: tl.constexpr,
               I: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One tile of down_proj: each pair's row times its routing weight, written to its (token, slot) place."""
    pair = tl.load(rows_ptr + offs_m, mask=m_mask, other=0)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < I
        ha = tl.load(h_ptr + offs_m[:, None].to(tl.int64) * I + offs_k[None, :],
                     mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        wd = tl.load(w_e + offs_n[None, :] * I + offs_k[:, None], mask=k_mask[:, None] & n_mask[None, :],
                     other=0.0)
        acc += tl.dot(ha, wd)
    scale = tl.load(scale_ptr + pair, mask=m_mask, other=0.0).to(tl.float32)
    y = acc * scale[:, None]
    tl.store(out_ptr + pair[:, None].to(tl.int64) * H + offs_n[None, :], y.to(out_ptr.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _gate_up(x_ptr, w_ptr, h_ptr, rows_ptr, ends_ptr, H: tl.constexpr, I: tl.constexpr, TOP_K: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ILV: tl.constexpr):
    e = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < I
    start = tl.load(ends_ptr + tl.maximum(e - 1, 0)) * (e > 0)
    end = tl.load(ends_ptr + e)
    w_e = w_ptr + e.to(tl.int64) * (2 * I * H)
    m0 = start
    while m0 < end:
        offs_m = m0 + tl.arange(0, BLOCK_M)
        m0 += BLOCK_M
        _gate_up_tile(x_ptr, w_e, h_ptr, rows_ptr, offs_m, offs_m < end, offs_n, n_mask, H, I, TOP_K, BLOCK_M,
                      BLOCK_N, BLOCK_K, ILV)


@triton.jit
def _down(h_ptr, w_ptr, out_ptr, rows_ptr, ends_ptr, scale_ptr, H: tl.constexpr, I: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    e = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < H
    start = tl.load(ends_ptr + tl.maximum(e - 1, 0)) * (e > 0)
    end = tl.load(ends_ptr + e)
    w_e = w_ptr + e.to(tl.int64) * (H * I)
    m0 = start
    while m0 < end:
        offs_m = m0 + tl.arange(0, BLOCK_M)
        m0 += BLOCK_M
        _down_tile(h_ptr, w_e, out_ptr, rows_ptr, scale_ptr, offs_m, offs_m < end, offs_n, n_mask, H, I, BLOCK_M,
                   BLOCK_N, BLOCK_K)


@triton.jit
def _tile(ends_ptr, b, E: tl.constexpr, EBLOCK: tl.constexpr, BLOCK_M: tl.constexpr):
    """Tile b of the grouped pairs: each expert's pairs cut into BLOCK_M-row tiles, experts in order. Returns
    (expert, first row, end of the expert's rows); expert E when b is past the last tile."""
    offs_e = tl.arange(0, EBLOCK)
    ends = tl.load(ends_ptr + offs_e, mask=offs_e < E, other=0)
    starts = tl.load(ends_ptr + offs_e - 1, mask=(offs_e > 0) & (offs_e < E), other=0)
    tiles = (tl.maximum(ends - starts, 0) + BLOCK_M - 1) // BLOCK_M
    upto = tl.cumsum(tiles, axis=0)                                   # tiles of experts <= e
    e = tl.sum((upto <= b).to(tl.int32), axis=0)
    before = tl.sum(tl.where(offs_e < e, tiles, 0), axis=0)
    start = tl.sum(tl.where(offs_e == e, starts, 0), axis=0)
    end = tl.sum(tl.where(offs_e == e, ends, 0), axis=0)
    return e, start + (b - before) * BLOCK_M, end


@triton.jit
def _gate_up_tiled(x_ptr, w_ptr, h_ptr, rows_ptr, ends_ptr, H: tl.constexpr, I: tl.constexpr, TOP_K: tl.constexpr,
                   E: tl.constexpr, EBLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, ILV: tl.constexpr):
    """_gate_up for many tokens: a program per (tile of one expert's pairs, N-block), so an expert chosen by
    many pairs is spread over as many programs as its tiles (no expert's rows run in one program). Where the
    weights cannot take a TMA descriptor (_tma)."""
    e, m0, end = _tile(ends_ptr, tl.program_id(0), E, EBLOCK, BLOCK_M)
    if e < E:
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        _gate_up_tile(x_ptr, w_ptr + e.to(tl.int64) * (2 * I * H), h_ptr, rows_ptr, offs_m, offs_m < end, offs_n,
                      offs_n < I, H, I, TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, ILV)


@triton.jit
def _down_tiled(h_ptr, w_ptr, out_ptr, rows_ptr, ends_ptr, scale_ptr, H: tl.constexpr, I: tl.constexpr,
                E: tl.constexpr, EBLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """_down for many tokens, tiled as _gate_up_tiled."""
    e, m0, end = _tile(ends_ptr, tl.program_id(0), E, EBLOCK, BLOCK_M)
    if e < E:
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        _down_tile(h_ptr, w_ptr + e.to(tl.int64) * (H * I), out_ptr, rows_ptr, scale_ptr, offs_m, offs_m < end,
                   offs_n, offs_n < H, H, I, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _gate_up_tiled_tma(x_ptr, w_desc, h_ptr, rows_ptr, ends_ptr, H: tl.constexpr, I: tl.constexpr,
                       TOP_K: tl.constexpr, E: tl.constexpr, EBLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """_gate_up_tiled with the weights' blocks read through a TMA descriptor over gate_up_proj as [E * 2I, H]
    (the tensor memory accelerator copies each [BLOCK_N, BLOCK_K] block; zeros past H). A block's rows past the
    expert's I gate rows read the up rows or the next expert's, whose columns are not stored."""
    e, m0, end = _tile(ends_ptr, tl.program_id(0), E, EBLOCK, BLOCK_M)
    if e < E:
        n0 = tl.program_id(1) * BLOCK_N
        offs_n = n0 + tl.arange(0, BLOCK_N)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        m_mask = offs_m < end
        tok = tl.load(rows_ptr + offs_m, mask=m_mask, other=0) // TOP_K
        row = e * (2 * I) + n0
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            xa = tl.load(x_ptr + tok[:, None].to(tl.int64) * H + offs_k[None, :],
                         mask=m_mask[:, None] & (offs_k < H)[None, :], other=0.0)
            wg = w_desc.load([row, k0])
            wu = w_desc.load([row + I, k0])
            acc_g += tl.dot(xa, wg.T)
            acc_u += tl.dot(xa, wu.T)
        h = acc_g * tl.sigmoid(acc_g) * acc_u
        tl.store(h_ptr + offs_m[:, None].to(tl.int64) * I + offs_n[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=m_mask[:, None] & (offs_n < I)[None, :])


@triton.jit
def _down_tiled_tma(h_ptr, d_desc, out_ptr, rows_ptr, ends_ptr, scale_ptr, H: tl.constexpr, I: tl.constexpr,
                    E: tl.constexpr, EBLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    """_down_tiled with down_proj's blocks read through a TMA descriptor over it as [E * H, I]."""
    e, m0, end = _tile(ends_ptr, tl.program_id(0), E, EBLOCK, BLOCK_M)
    if e < E:
        n0 = tl.program_id(1) * BLOCK_N
        offs_n = n0 + tl.arange(0, BLOCK_N)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        m_mask = offs_m < end
        pair = tl.load(rows_ptr + offs_m, mask=m_mask, other=0)
        row = e * H + n0
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            ha = tl.load(h_ptr + offs_m[:, None].to(tl.int64) * I + offs_k[None, :],
                         mask=m_mask[:, None] & (offs_k < I)[None, :], other=0.0)
            wd = d_desc.load([row, k0])
            acc += tl.dot(ha, wd.T)
        scale = tl.load(scale_ptr + pair, mask=m_mask, other=0.0).to(tl.float32)
        y = acc * scale[:, None]
        tl.store(out_ptr + pair[:, None].to(tl.int64) * H + offs_n[None, :], y.to(out_ptr.dtype.element_ty),
                 mask=m_mask[:, None] & (offs_n < H)[None, :])


def _desc(w: torch.Tensor, block: list[int]):
    """A host TMA descriptor over w's [experts * rows, K] view."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor.from_tensor(w.view(-1, w.shape[-1]), block)


# BLOCK_M rows of one expert's pairs at a time (tl.dot's least), N and K blocks of its weights, warps, stages
# (measured on the H200 at the thinker's and the talker's shapes, 1 to 64 tokens: examples/bench/bench_moe.py)
BLOCKS = {"gate_up": (16, 32, 128, 4, 4), "down": (16, 32, 128, 2, 4)}
# steps of more than TILED_FROM token-expert pairs (64 of the thinker's tokens) run the tiled kernels (a
# program per tile of an expert's pairs) with these blocks (examples/bench/bench_moe.py --sweep on the H200)
TILED_FROM = 512
TILED = {"gate_up": (64, 64, 64, 4, 3), "down": (64, 128, 64, 4, 3)}
# past these many pairs, larger tiles where the sweep found them faster (--sweep --skew 3 on the H200, one thinker
# layer's experts, us: at 4,096 pairs TILED was within 0.4% of the best; at 16,384 (2,048 tokens) down at 128 x 256,
# 8 warps, 4 stages: 552.8 against 563.6; at 65,536 (8,192 tokens) gate_up at 64 x 256, 8 warps: 1,625.7 against
# 1,807.1, then down as at 16,384: 1,568.9 against 1,691.4)
TILED_LARGE = [(8192, {"down": (128, 256, 64, 8, 4)}),
               (32768, {"gate_up": (64, 256, 64, 8, 3), "down": (128, 256, 64, 8, 4)})]
# the tiled kernels read the weights through TMA descriptors (_gate_up_tiled_tma, _down_tiled_tma) where the
# GPU has TMA (sm_90 on) and the weights' rows are contiguous and 16-byte aligned. H200, one layer's experts
# with skewed routing (examples/bench/bench_moe.py --tokens 512 2048 8192 --skew 3 [--no-tma]), us: thinker 367.8 ->
# 362.3, 557.3 -> 528.7, 1,482.8 -> 1,474.3; talker 114.6 -> 110.2, 174.9 -> 170.0, 470.0 -> 450.9; the same error
TMA = True
GROUP_BLOCK = 64
COUNT_SUB = 128       # pairs the counting sort's programs compare at a time (a block is a multiple)


def _tiled(kind: str, pairs: int) -> tuple[int, int, int, int, int]:
    """The tiled kernel's blocks for a step of this many pairs: TILED, or TILED_LARGE's past its starts."""
    cfg = TILED[kind]
    for start, larger in TILED_LARGE:
        if pairs > start and kind in larger:
            cfg = larger[kind]
    return cfg


def _tma(w: torch.Tensor) -> bool:
    """Whether a weight's blocks go through a TMA descriptor: TMA on, rows contiguous and 16-byte aligned, and a
    GPU of sm_90 on (a CPU tensor: the interpreter, which runs descriptors)."""
    if not (TMA and w.is_contiguous() and w.shape[-1] * w.element_size() % 16 == 0 and w.data_ptr() % 16 == 0):
        return False
    return w.device.type != "cuda" or torch.cuda.get_device_capability(w.device)[0] >= 9


def _count_blocks(experts: torch.Tensor, counts: torch.Tensor) -> tuple[int, int, int, int]:
    """(pairs, blocks, pairs a block, experts) of a counting sort, its counts buffer checked against
    moe_sort.count_blocks."""
    p, (nb, num_experts) = experts.numel(), counts.shape
    block, n = count_blocks(p)
    if nb != n:
        raise ValueError(f"moe counting sort: {nb} blocks of counts for {p} pairs, where count_blocks says {n}")
    return p, nb, block, num_experts


def count(experts: torch.Tensor, counts: torch.Tensor) -> None:
    """experts [P] -> counts [moe_sort.count_blocks(P), E] int32: each block's pairs per expert."""
    p, nb, block, num_experts = _count_blocks(experts, counts)
    if p:
        _count[(nb,)](experts, counts, p, E=num_experts, BLOCK=block, SUB=min(COUNT_SUB, block),
                      EBLOCK=triton.next_power_of_2(num_experts), num_warps=4)


def place(experts: torch.Tensor, counts: torch.Tensor, rows: torch.Tensor, ends: torch.Tensor) -> None:
    """experts [P], counts (count's) -> rows [P] int32 (pairs by expert, then by index), ends [E] int32: what
    group gives, in two launches whose work grows as P x the block (group's grows as P squared)."""
    p, nb, block, num_experts = _count_blocks(experts, counts)
    if p:
        _place[(nb,)](experts, counts, rows, ends, p, nb, 0, E=num_experts, BLOCK=block, SUB=min(COUNT_SUB, block),
                      EBLOCK=triton.next_power_of_2(num_experts), NBLOCK=triton.next_power_of_2(nb), TILE=0,
                      TBLOCK=1, num_warps=4)


TILES_BLOCK = 64      # the tiles place_tiles maps at a time


def place_tiles(experts: torch.Tensor, counts: torch.Tensor, rows: torch.Tensor, tiles: torch.Tensor,
                tile: int) -> None:
    """experts [P], counts (count's) -> the SM90 grouped GEMMs' maps (moe_sm90.py): each expert's pairs from a
    multiple of `tile` on, rows [max_tiles * tile] int32 (rows[padded rank] = the pair; padding rows are not
    written), tiles [2 max_tiles + 1] int32 (each tile's expert, then each tile's end of its expert's padded
    rows, then the tiles in use)."""
    p, nb, block, num_experts = _count_blocks(experts, counts)
    max_tiles = (tiles.numel() - 1) // 2
    if tiles.numel() != 2 * max_tiles + 1 or rows.numel() != max_tiles * tile:
        raise ValueError(f"moe place_tiles: rows {rows.numel()} and tiles {tiles.numel()} are not "
                         f"[max_tiles * {tile}] and [2 max_tiles + 1]")
    if p:
        _place[(nb,)](experts, counts, rows, tiles, p, nb, max_tiles, E=num_experts, BLOCK=block,
                      SUB=min(COUNT_SUB, block), EBLOCK=triton.next_power_of_2(num_experts),
                      NBLOCK=triton.next_power_of_2(nb), TILE=tile, TBLOCK=TILES_BLOCK, num_warps=4)


def group(experts: torch.Tensor, rows: torch.Tensor, ends: torch.Tensor) -> None:
    """experts [P] (flat token-expert pairs) -> rows [P] int32 (pairs by expert), ends [E] int32."""
    p, num_experts = experts.numel(), ends.numel()
    _group[(triton.cdiv(p, GROUP_BLOCK),)](experts, rows, ends, p, E=num_experts, BLOCK=GROUP_BLOCK,
                                           EBLOCK=triton.next_power_of_2(num_experts))


def gate_up(x: torch.Tensor, gate_up_proj: torch.Tensor, h: torch.Tensor, rows: torch.Tensor, ends: torch.Tensor,
            top_k: int, interleave: int = 0) -> None:
    """h [P, I] (grouped order) = silu(x W_gate) * (x W_up) of each pair's token and expert; gate_up_proj's rows
    are gate's then up's, or up's and gate's `interleave` rows at a time (Experts.gate_up_layout)."""
    num_experts, two_i, hidden = gate_up_proj.shape
    if h.shape[0] > TILED_FROM:
        bm, bn, bk, warps, stages = _tiled("gate_up", h.shape[0])
        grid = (triton.cdiv(h.shape[0], bm) + num_experts, triton.cdiv(two_i // 2, bn))
        if not interleave and _tma(gate_up_proj):
            _gate_up_tiled_tma[grid](x, _desc(gate_up_proj, [bn, bk]), h, rows, ends, hidden, two_i // 2, top_k,
                                     num_experts, triton.next_power_of_2(num_experts), BLOCK_M=bm, BLOCK_N=bn,
                                     BLOCK_K=bk, num_warps=warps, num_stages=stages)
            return
        _gate_up_tiled[grid](x, gate_up_proj, h, rows, ends, hidden, two_i // 2, top_k, num_experts,
                             triton.next_power_of_2(num_experts), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, ILV=interleave,
                             num_warps=warps, num_stages=stages)
        return
    bm, bn, bk, warps, stages = BLOCKS["gate_up"]
    _gate_up[(num_experts, triton.cdiv(two_i // 2, bn))](x, gate_up_proj, h, rows, ends, hidden, two_i // 2, top_k,
                                                        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, ILV=interleave,
                                                        num_warps=warps, num_stages=stages)


def down(h: torch.Tensor, down_proj: torch.Tensor, pairs: torch.Tensor, rows: torch.Tensor, ends: torch.Tensor,
         weights: torch.Tensor) -> None:
    """pairs [P, H] ((token, slot) order) = weight x (h W_down) of each pair."""
    num_experts, hidden, inter = down_proj.shape
    if pairs.shape[0] > TILED_FROM:
        bm, bn, bk, warps, stages = _tiled("down", pairs.shape[0])
        grid = (triton.cdiv(pairs.shape[0], bm) + num_experts, triton.cdiv(hidden, bn))
        if _tma(down_proj):
            _down_tiled_tma[grid](h, _desc(down_proj, [bn, bk]), pairs, rows, ends, weights, hidden, inter,
                                  num_experts, triton.next_power_of_2(num_experts), BLOCK_M=bm, BLOCK_N=bn,
                                  BLOCK_K=bk, num_warps=warps, num_stages=stages)
            return
        _down_tiled[grid](h, down_proj, pairs, rows, ends, weights, hidden, inter, num_experts,
                          triton.next_power_of_2(num_experts), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                          num_warps=warps, num_stages=stages)
        return
    bm, bn, bk, warps, stages = BLOCKS["down"]
    _down[(num_experts, triton.cdiv(hidden, bn))](h, down_proj, pairs, rows, ends, weights, hidden, inter,
                                                 BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
                                                 num_stages=stages)


@triton.jit
def _top_k(logits_ptr, row, E, l_stride, TOP_K: tl.constexpr, NORM: tl.constexpr, BLOCK: tl.constexpr,
           KBLOCK: tl.constexpr):
    """One token's router: softmax in fp32 over its E logits, the top k (highest first; among equal
    probabilities the lowest expert), renormalised over the k when NORM. Returns (experts [KBLOCK] int64,
    weights [KBLOCK] fp32), the slots past TOP_K zero."""
    offs = tl.arange(0, BLOCK)
    logit = tl.load(logits_ptr + row * l_stride + offs, mask=offs < E, other=-float("inf")).to(tl.float32)
    e = tl.exp(logit - tl.max(logit, axis=0))
    p = e / tl.sum(e, axis=0)
    kk = tl.arange(0, KBLOCK)
    w = tl.zeros([KBLOCK], dtype=tl.float32)
    ex = tl.zeros([KBLOCK], dtype=tl.int64)
    for i in tl.static_range(TOP_K):
        best = tl.max(p, axis=0)
        pick = tl.min(tl.where(p == best, offs, BLOCK), axis=0)
        w = tl.where(kk == i, best, w)
        ex = tl.where(kk == i, pick.to(tl.int64), ex)
        p = tl.where(offs == pick, -1.0, p)
    if NORM:
        w = w / tl.sum(w, axis=0)
    return ex, w


@triton.jit
def _route(logits_ptr, ex_ptr, w_ptr, E, l_stride, TOP_K: tl.constexpr, NORM: tl.constexpr, BLOCK: tl.constexpr,
           KBLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """A program per token: its router (_top_k), the experts and the weights (cast to their dtype) written."""
    _pdl_start(PDL)
    _pdl_wait(PDL)
    row = tl.program_id(0)
    ex, w = _top_k(logits_ptr, row, E, l_stride, TOP_K, NORM, BLOCK, KBLOCK)
    kk = tl.arange(0, KBLOCK)
    tl.store(ex_ptr + row * TOP_K + kk, ex, mask=kk < TOP_K)
    tl.store(w_ptr + row * TOP_K + kk, w.to(w_ptr.dtype.element_ty), mask=kk < TOP_K)


def route(logits: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, norm: bool, pdl: bool = False) -> None:
    """logits [T, E] (rows strided, elements contiguous) -> experts [T, k] int64 and weights [T, k]. pdl: launched
    with programmatic dependent launch (resources/pdl.py)."""
    t, e = logits.shape
    k = experts.shape[1]
    if t:
        _route[(t,)](logits, experts, weights, e, logits.stride(0), TOP_K=k, NORM=norm,
                     BLOCK=triton.next_power_of_2(e), KBLOCK=triton.next_power_of_2(k), num_warps=1,
                     **pdl_launch(pdl, logits))


@triton.jit
def _slot_sum(pairs_ptr, w_ptr, t, offs, m, H, TOP_K: tl.constexpr, BLOCK: tl.constexpr, SCALED: tl.constexpr):
    """Token t's TOP_K slots' rows at columns offs (mask m) summed in fp32, each times w[t, j] first where SCALED."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        row = tl.load(pairs_ptr + (t * TOP_K + j) * H + offs, mask=m, other=0.0).to(tl.float32)
        if SCALED:
            row = row * tl.load(w_ptr + t * TOP_K + j).to(tl.float32)
        acc += row
    return acc


@triton.jit
def _sum_add(pairs_ptr, w_ptr, res_ptr, y_ptr, H, res_row, TOP_K: tl.constexpr, BLOCK: tl.constexpr,
             SCALED: tl.constexpr, RESIDUAL: tl.constexpr, PDL: tl.constexpr = False):
    """One token's BLOCK columns: y = residual + sum over its TOP_K slots, the slots summed in fp32 and
    rounded once (as torch's sum over them), then the residual's add rounded (as torch's add). SCALED: each
    slot's row times its routing weight w[t, j] first, in fp32; without RESIDUAL, y is the rounded sum."""
    _pdl_start(PDL)
    _pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < H
    acc = _slot_sum(pairs_ptr, w_ptr, t, offs, m, H, TOP_K, BLOCK, SCALED)
    dt = y_ptr.dtype.element_ty
    if RESIDUAL:
        s = acc.to(dt).to(tl.float32)
        r = tl.load(res_ptr + t * res_row + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + t * H + offs, (r + s).to(dt), mask=m)
    else:
        tl.store(y_ptr + t * H + offs, acc.to(dt), mask=m)


SUM_BLOCK = 1024


def sum_add(pairs: torch.Tensor, residual: torch.Tensor | None, y: torch.Tensor,
            weights: torch.Tensor | None = None, pdl: bool = False) -> None:
    """pairs [T, k, H] contiguous, residual [T, H] (rows may be strided) or None, y [T, H] contiguous:
    y = residual + pairs.sum(1); with weights [T, k] (contiguous), each slot's row scaled by its weight first.
    pdl: as route's."""
    t, k, h = pairs.shape
    if t and h:
        _sum_add[(t, triton.cdiv(h, SUM_BLOCK))](pairs, pairs if weights is None else weights,
                                                 y if residual is None else residual, y, h,
                                                 0 if residual is None else residual.stride(0), TOP_K=k,
                                                 BLOCK=SUM_BLOCK, SCALED=weights is not None,
                                                 RESIDUAL=residual is not None, num_warps=4,
                                                 **pdl_launch(pdl, pairs))
