"""RMSNorm, residual add + RMSNorm, and Qwen3's qk-norm + rotary embedding, one Triton launch each
(issue 13).

The torch path of layers.RMSNorm is eight kernels (a cast, a square, a mean, an add, an rsqrt, a product,
a cast, the weight's product); the residual add before it another; each of q and k then takes eight for its
norm and five for the rotary embedding (a negation, a cat, two products, a sum). At one decode token each
is a few microseconds of launch and almost no work: about forty of the thinker's eighty launches a layer.

    rms_norm       y = w * (x * rsqrt(mean(x^2) + eps)), a program per row
    add_rms_norm   s = x + r (the residual sum, written), y = rms_norm(s): one read of each, two writes
    layer_norm     nn.LayerNorm's y = (x - mean) * rstd * w + b, in fp32 and rounded once (torch: one kernel
                   at 2.8 times its memory floor at the vision tower's 1,152 wide rows), and add_layer_norm
                   with the residual sum as add_rms_norm
    qk_norm_rope   y = rope(rms_norm(x)) over each [head_dim] row of q or k, cos and sin given per row, a
                   program per (row, block of ROPE_HEADS heads)
    q_k_norm_rope  the same over q's and k's heads of a row in one launch, each with its own norm weight
    q_k_rope_f32   q's and k's rotary alone, in fp32 and rounded once (the vision encoder's, heads 72 wide)
    silu_mul       y = silu(gate) * up over a SwiGLU's [gate | up] projection rows (torch: two launches)
    zc_rms_norm    the zero-centred norm of Qwen3.5 (HF's Qwen3_5RMSNorm): y = x * rstd * (1 + w) in fp32, rounded
                   once, over [D] rows or each head's row of [N, H, D] (torch: ten launches), and add_zc_rms_norm
                   with the residual sum as add_rms_norm
    gated_rms_norm the Gated DeltaNet's output norm (HF's Qwen3_5RMSNormGated) of the core's fp32 rows: rounded
                   to the gate's dtype, normed and rounded, times w and rounded, times silu(gate) in fp32,
                   rounded once (torch: the cast before it, the norm and four more launches)

Each rounds where the torch path (HF's order) rounds: the sum in the input dtype, the normalised row cast
to the input dtype before the weight's product (zc_rms_norm: not, as HF's Qwen3_5RMSNorm), each rotary product
and their sum in the input dtype; only the mean's summation order differs. tests/gpu compares them with the torch path at the real shapes;
tests/unit runs them under Triton's interpreter on CPU. norm_ops.py makes them torch operators.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from resources.pdl import _pdl_start, _pdl_wait, pdl_launch


@triton.jit
def _round(x, BF16: tl.constexpr):
    """x (fp32) rounded to bf16's nearest (ties to even) and back: the torch path's rounding after an op.
    In integer ops: Triton 3.6 folded x.to(bf16).to(fp32) away where the product fed an add (seen on the
    H200: the rotary sum rounded once, 23% of elements an ulp off torch's), and its interpreter casts by
    truncation; this rounds the same on both (the casts to bf16 after it are exact). fp32: nothing."""
    if BF16:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        x = b.to(tl.float32, bitcast=True)
    return x


@triton.jit
def _residual_row(x_ptr, r_ptr, s_ptr, row, D, x_stride, r_stride, s_stride, HAS_RES: tl.constexpr,
                  BLOCK: tl.constexpr, write=True):
    """A norm's input row in fp32 (offsets and mask with it); with HAS_RES the residual sum x + r, rounded to the
    input dtype as torch's add rounds, and written to s where `write` (one program of several that read the row)."""
    offs = tl.arange(0, BLOCK)
    m = offs < D
    BF16: tl.constexpr = x_ptr.dtype.element_ty == tl.bfloat16
    x32 = tl.load(x_ptr + row * x_stride + offs, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        x32 = _round(x32 + tl.load(r_ptr + row * r_stride + offs, mask=m, other=0.0).to(tl.float32), BF16)
        tl.store(s_ptr + row * s_stride + offs, x32.to(s_ptr.dtype.element_ty), mask=offs < tl.where(write, D, 0))
    return offs, m, x32


@triton.jit
def _rms_scaled(x32, w, D, eps, BF16: tl.constexpr):
    """rms_norm(x) * w as the torch path rounds it: the normalised row rounded to the input dtype, then the
    weight's product rounded (fp32 values)."""
    rstd = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=0) / D + eps)
    return _round(w * _round(x32 * rstd, BF16), BF16)


@triton.jit
def _rms_norm(x_ptr, r_ptr, s_ptr, w_ptr, y_ptr, D, x_stride, r_stride, s_stride, y_stride, eps,
              HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    _pdl_start(PDL)
    row = tl.program_id(0)
    BF16: tl.constexpr = x_ptr.dtype.element_ty == tl.bfloat16
    w = tl.load(w_ptr + tl.arange(0, BLOCK), mask=tl.arange(0, BLOCK) < D, other=0.0).to(tl.float32)
    _pdl_wait(PDL)
    offs, m, x32 = _residual_row(x_ptr, r_ptr, s_ptr, row, D, x_stride, r_stride, s_stride, HAS_RES, BLOCK)
    tl.store(y_ptr + row * y_stride + offs, _rms_scaled(x32, w, D, eps, BF16).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _zc_rms_norm(x_ptr, r_ptr, s_ptr, w_ptr, y_ptr, H, D, x_row, x_head, r_stride, s_stride, y_row, y_head, eps,
                 HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    """A zero-centred RMSNorm (HF's Qwen3_5RMSNorm) of head pid % H of row pid // H: y = x * rstd * (1 + w), all
    in fp32 and rounded once to y's dtype; with HAS_RES (H = 1), of the residual sum x + r rounded to the input
    dtype (written to s), as torch's add then the norm."""
    pid = tl.program_id(0)
    row, head = pid // H, pid % H
    offs, m, x32 = _residual_row(x_ptr + head * x_head, r_ptr, s_ptr, row, D, x_row, r_stride, s_stride, HAS_RES,
                                 BLOCK)
    rstd = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=0) / D + eps)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    y = _round(x32 * rstd * (1.0 + w), y_ptr.dtype.element_ty == tl.bfloat16)
    tl.store(y_ptr + row * y_row + head * y_head + offs, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _gated_rms_norm(x_ptr, z_ptr, w_ptr, y_ptr, D, H, x_row, z_outer, z_inner, y_row, eps, BLOCK: tl.constexpr):
    """The Gated DeltaNet's output norm of one row (HF's Qwen3_5RMSNormGated), x first rounded to y's dtype (the
    core's fp32 output cast): the normed row rounded, its product with w rounded, that times silu(z) in fp32 and
    rounded once. Row r's gate is head r % H of gate row r // H."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < D
    BF16: tl.constexpr = y_ptr.dtype.element_ty == tl.bfloat16
    x = _round(tl.load(x_ptr + row * x_row + offs, mask=m, other=0.0).to(tl.float32), BF16)
    h = _rms_scaled(x, tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32), D, eps, BF16)
    z = tl.load(z_ptr + (row // H) * z_outer + (row % H) * z_inner + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * y_row + offs, _round(h * (z / (1.0 + tl.exp(-z))), BF16).to(y_ptr.dtype.element_ty),
             mask=m)


@triton.jit
def _layer_norm(x_ptr, r_ptr, s_ptr, w_ptr, b_ptr, y_ptr, D, x_stride, r_stride, s_stride, y_stride, eps,
                HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    """nn.LayerNorm's row in fp32 (mean, then the centred row's mean square: two passes over registers), the
    weight's product and the bias's sum in fp32, rounded once, as torch's kernel rounds; with HAS_RES, of the
    residual sum x + r rounded to the input dtype (written to s), as torch's add then its norm."""
    row = tl.program_id(0)
    BF16: tl.constexpr = x_ptr.dtype.element_ty == tl.bfloat16
    offs, m, x32 = _residual_row(x_ptr, r_ptr, s_ptr, row, D, x_stride, r_stride, s_stride, HAS_RES, BLOCK)
    mean = tl.sum(x32, axis=0) / D
    xc = tl.where(m, x32 - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / D + eps)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * y_stride + offs, _round(xc * rstd * w + b, BF16).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _norm_rope_heads(x_base, x_head, w_ptr, c_base, s_base, y_base, y_head, first, heads, eps, D: tl.constexpr,
                     G: tl.constexpr):
    """Heads [first, first + G) (those < heads) of one row, each a [D] row at x_base + h * x_head:
    y = rope(rms_norm(x) * w), rounded where the torch path rounds. G heads a program, so that a long prefill
    runs G times fewer programs than one a head (73,728 single-warp programs at the thinker's 2,048 tokens).
    Each head is read as its two halves, [G, D / 2] blocks: the rotate-half partner of one half's column is the
    other's same column, so no element is loaded twice (H200, thinker's 2,048 rows at 4 heads over 2 warps:
    27.6 us with each head and its partner loaded, 21.6 as halves)."""
    HALF: tl.constexpr = D // 2
    hs = first + tl.arange(0, G)
    hm = (hs < heads)[:, None]
    lo = tl.arange(0, HALF)
    p1 = x_base + hs[:, None] * x_head + lo[None, :]
    x1 = tl.load(p1, mask=hm, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=hm, other=0.0).to(tl.float32)
    rstd = (1.0 / tl.sqrt(tl.sum(x1 * x1 + x2 * x2, axis=1) / D + eps))[:, None]
    dt = y_base.dtype.element_ty
    BF16: tl.constexpr = dt == tl.bfloat16
    n1 = _round(tl.load(w_ptr + lo).to(tl.float32)[None, :] * _round(x1 * rstd, BF16), BF16)   # the normed halves
    n2 = _round(tl.load(w_ptr + HALF + lo).to(tl.float32)[None, :] * _round(x2 * rstd, BF16), BF16)
    c1 = tl.load(c_base + lo).to(tl.float32)[None, :]
    c2 = tl.load(c_base + HALF + lo).to(tl.float32)[None, :]
    s1 = tl.load(s_base + lo).to(tl.float32)[None, :]
    s2 = tl.load(s_base + HALF + lo).to(tl.float32)[None, :]
    y1 = y_base + hs[:, None] * y_head + lo[None, :]
    # rotate_half(n) = cat(-n2, n1): y = n * cos + rotate_half(n) * sin, each product rounded, then the sum
    tl.store(y1, _round(_round(n1 * c1, BF16) + _round(-n2 * s1, BF16), BF16).to(dt), mask=hm)
    tl.store(y1 + HALF, _round(_round(n2 * c2, BF16) + _round(n1 * s2, BF16), BF16).to(dt), mask=hm)


@triton.jit
def _qk_norm_rope(x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, HEADS, x_row, x_head, y_row, y_head, c_row, eps,
                  D: tl.constexpr, G: tl.constexpr):
    """A program per (row, block of G heads)."""
    blocks = tl.cdiv(HEADS, G)
    pid = tl.program_id(0)
    row = pid // blocks
    first = (pid % blocks) * G
    _norm_rope_heads(x_ptr + row * x_row, x_head, w_ptr, cos_ptr + row * c_row, sin_ptr + row * c_row,
                     y_ptr + row * y_row, y_head, first, HEADS, eps, D, G)


@triton.jit
def _zc_rope_head(x_base, w_ptr, c_base, s_base, y_base, eps, D: tl.constexpr, R: tl.constexpr,
                  BLOCK: tl.constexpr):
    """One head's [D] row: its zero-centred norm as _zc_rms_norm computes it (x * rstd * (1 + w) in fp32, rounded
    once), then rotate-half rotary on its first R dims, each product and the sum rounded as torch's bf16 ops round
    them; dims R.. pass through normed. A rotary column's partner (the other half's same column) is normed again
    from its own load rather than moved across lanes."""
    BF16: tl.constexpr = y_base.dtype.element_ty == tl.bfloat16
    HALF: tl.constexpr = R // 2
    offs = tl.arange(0, BLOCK)
    m = offs < D
    x = tl.load(x_base + offs, mask=m, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    n = _round(x * rstd * (1.0 + tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)), BF16)
    rot = offs < R
    partner = tl.where(offs < HALF, offs + HALF, offs - HALF)
    xp = tl.load(x_base + partner, mask=rot, other=0.0).to(tl.float32)
    npart = _round(xp * rstd * (1.0 + tl.load(w_ptr + partner, mask=rot, other=0.0).to(tl.float32)), BF16)
    c = tl.load(c_base + offs, mask=rot, other=0.0).to(tl.float32)
    s = tl.load(s_base + offs, mask=rot, other=0.0).to(tl.float32)
    signed = tl.where(offs < HALF, -npart, npart)              # rotate_half(n) = cat(-n2, n1)
    y = tl.where(rot, _round(_round(n * c, BF16) + _round(signed * s, BF16), BF16), n)
    tl.store(y_base + offs, y.to(y_base.dtype.element_ty), mask=m)


@triton.jit
def _zc_norm_partial_rope(q_ptr, k_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, yq_ptr, yk_ptr, HQ, HK, q_row, q_head,
                          k_row, k_head, yq_row, yq_head, yk_row, yk_head, c_row, eps, D: tl.constexpr,
                          R: tl.constexpr, BLOCK: tl.constexpr):
    """A program per (row, head of q, then of k)."""
    pid = tl.program_id(0)
    row, h = pid // (HQ + HK), pid % (HQ + HK)
    c_base, s_base = cos_ptr + row * c_row, sin_ptr + row * c_row
    if h < HQ:
        _zc_rope_head(q_ptr + row * q_row + h * q_head, wq_ptr, c_base, s_base, yq_ptr + row * yq_row + h * yq_head,
                      eps, D, R, BLOCK)
    else:
        _zc_rope_head(k_ptr + row * k_row + (h - HQ) * k_head, wk_ptr, c_base, s_base,
                      yk_ptr + row * yk_row + (h - HQ) * yk_head, eps, D, R, BLOCK)


@triton.jit
def _head_block(HQ, HK, HV, G: tl.constexpr):
    """The grid of the q/k(/v) kernels: a program per (row, block of G heads of q, then of k, then of v). Returns
    the program's row, its block b of the row, and where k's (bq) and v's (bk) blocks start."""
    bq = tl.cdiv(HQ, G)
    bk = bq + tl.cdiv(HK, G)
    blocks = bk + tl.cdiv(HV, G)
    pid = tl.program_id(0)
    return pid // blocks, pid % blocks, bq, bk


@triton.jit
def _q_k_norm_rope(q_ptr, k_ptr, v_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, yq_ptr, yk_ptr, yv_ptr, HQ, HK, HV, q_row,
                   q_head, k_row, k_head, v_row, v_head, yq_row, yq_head, yk_row, yk_head, yv_row, yv_head, c_row, eps,
                   D: tl.constexpr, G: tl.constexpr, PDL: tl.constexpr = False):
    """q's and k's heads of a row in one grid, with v's copy where HV > 0: a program per (row, block of G heads of
    q, then of k, then of v)."""
    _pdl_start(PDL)
    _pdl_wait(PDL)
    row, b, bq, bk = _head_block(HQ, HK, HV, G)
    c_base, s_base = cos_ptr + row * c_row, sin_ptr + row * c_row
    if b < bq:
        _norm_rope_heads(q_ptr + row * q_row, q_head, wq_ptr, c_base, s_base, yq_ptr + row * yq_row, yq_head,
                         b * G, HQ, eps, D, G)
    elif b < bk:
        _norm_rope_heads(k_ptr + row * k_row, k_head, wk_ptr, c_base, s_base, yk_ptr + row * yk_row, yk_head,
                         (b - bq) * G, HK, eps, D, G)
    else:
        _rope_f32_heads(v_ptr + row * v_row, v_head, c_base, s_base, yv_ptr + row * yv_row, yv_head, (b - bk) * G,
                        HV, D, D, D, G, False)


@triton.jit
def _rope_f32_heads(x_base, x_head, c_base, s_base, y_base, y_head, first, heads, D: tl.constexpr, W: tl.constexpr,
                    BLOCK_D: tl.constexpr, G: tl.constexpr, ROTATE: tl.constexpr):
    """Heads [first, first + G) (those < heads) of one row: y = x * cos + rotate_half(x) * sin in fp32 (cos and
    sin fp32), rounded once to y's dtype: apply_rope(x.float(), cos, sin).to(dtype), the vision encoder's order;
    without ROTATE, y = x. y's rows are W >= D wide, zeros after D (the head dim an attention kernel runs padded
    to). D need not be a power of two (the vision tower's heads are 72 wide)."""
    HALF: tl.constexpr = D // 2
    hs = first + tl.arange(0, G)
    offs = tl.arange(0, BLOCK_D)
    hm = (hs < heads)[:, None]
    m = hm & (offs < D)[None, :]
    out = y_base + hs[:, None] * y_head + offs[None, :]
    dt = y_base.dtype.element_ty
    if ROTATE:
        other = tl.where(offs < HALF, offs + HALF, offs - HALF)         # the rotate-half partner
        x = tl.load(x_base + hs[:, None] * x_head + offs[None, :], mask=m, other=0.0).to(tl.float32)
        xo = tl.load(x_base + hs[:, None] * x_head + other[None, :], mask=m, other=0.0).to(tl.float32)
        rot = tl.where((offs < HALF)[None, :], -xo, xo)                 # cat(-x[half:], x[:half])
        c = tl.load(c_base + offs, mask=offs < D, other=0.0)[None, :]
        s = tl.load(s_base + offs, mask=offs < D, other=0.0)[None, :]
        y = _round(x * c + rot * s, dt == tl.bfloat16)                  # to nearest, as torch's cast (and exact)
        tl.store(out, y.to(dt), mask=hm & (offs < W)[None, :])          # past D: 0 * 0 + 0 * 0, a +0
    else:
        x = tl.load(x_base + hs[:, None] * x_head + offs[None, :], mask=m, other=0.0)
        tl.store(out, x.to(dt), mask=hm & (offs < W)[None, :])


@triton.jit
def _q_k_rope_f32(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, yq_ptr, yk_ptr, yv_ptr, HQ, HK, HV, q_row, q_head, k_row,
                  k_head, v_row, v_head, yq_row, yq_head, yk_row, yk_head, yv_row, yv_head, c_row, D: tl.constexpr,
                  W: tl.constexpr, BLOCK_D: tl.constexpr, G: tl.constexpr):
    """q's and k's fp32 rotary in one grid, with v's copy where HV > 0, each W wide: a program per (row, block of
    G heads of q, then of k, then of v)."""
    row, b, bq, bk = _head_block(HQ, HK, HV, G)
    c_base, s_base = cos_ptr + row * c_row, sin_ptr + row * c_row
    if b < bq:
        _rope_f32_heads(q_ptr + row * q_row, q_head, c_base, s_base, yq_ptr + row * yq_row, yq_head, b * G, HQ, D, W,
                        BLOCK_D, G, True)
    elif b < bk:
        _rope_f32_heads(k_ptr + row * k_row, k_head, c_base, s_base, yk_ptr + row * yk_row, yk_head, (b - bq) * G, HK,
                        D, W, BLOCK_D, G, True)
    else:
        _rope_f32_heads(v_ptr + row * v_row, v_head, c_base, s_base, yv_ptr + row * yv_row, yv_head, (b - bk) * G, HV,
                        D, W, BLOCK_D, G, False)


# (heads a program, warps) for qk_norm_rope and q_k_norm_rope, for steps of up to ROPE_MANY_ROWS rows and for
# more (the same in both kernels, so that a head's row is reduced in the same order by either: tests hold the
# two launches bit-equal). H200, us a call (examples/bench/bench_prefill_kernels.py; thinker's 32 + 4 heads):
# 1 row (1, 1) 1.75, (4, 2) 2.02; 64 rows 2.97, 2.78; 2,048 rows 46.2, 27.3 (the best of seven choices). With
# each head read as two halves (ten choices; run rope-halves in docs/benchmarks.md): 1 row (1, 1) 1.69;
# 16 rows (1, 1) 2.04; 512 rows (4, 2) 7.00, (8, 4) 6.79; 2,048 rows (4, 2) 21.59, the best
ROPE_HEADS = {"few": (1, 1), "many": (4, 2)}
ROPE_MANY_ROWS = 16
# q_k_rope_f32's own (it reduces nothing, so need not match them), for the vision tower's 16 + 16 + 16 heads of
# 72 written padded to 128 (H200, us a call, examples/bench/bench_prefill_kernels.py --only vision_rope): 8,192 rows
# (4, 2) 63.0, (8, 4) 58.2, (16, 4) 55.8 (the best of seven; floor 36.9); 1,024 rows 9.24, 8.82, 8.07
ROPE_F32_HEADS = {"few": (1, 1), "many": (16, 4)}


def _rope_heads(rows: int, table: dict | None = None) -> tuple[int, int]:
    return (table or ROPE_HEADS)["many" if rows > ROPE_MANY_ROWS else "few"]


def _block(d: int) -> int:
    return triton.next_power_of_2(d)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, eps: float, pdl: bool = False) -> None:
    """x, y [N, D] (rows may be strided, elements contiguous), weight [D]: y = rms_norm(x) * weight. pdl: launched
    with programmatic dependent launch (on a GPU; pdl_launch)."""
    n, d = x.shape
    if n:
        _rms_norm[(n,)](x, x, x, weight, y, d, x.stride(0), 0, 0, y.stride(0), eps, HAS_RES=False,
                        BLOCK=_block(d), num_warps=4 if d >= 1024 else 1, **pdl_launch(pdl, x))


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, total: torch.Tensor,
                 y: torch.Tensor, eps: float, pdl: bool = False) -> None:
    """total = x + residual (rounded to their dtype); y = rms_norm(total) * weight. All [N, D]. pdl: as rms_norm's."""
    n, d = x.shape
    if n:
        _rms_norm[(n,)](x, residual, total, weight, y, d, x.stride(0), residual.stride(0), total.stride(0),
                        y.stride(0), eps, HAS_RES=True, BLOCK=_block(d), num_warps=4 if d >= 1024 else 1,
                        **pdl_launch(pdl, x))


def zc_rms_norm(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, eps: float) -> None:
    """x, y [N, H, D] (rows and heads may be strided, elements contiguous), weight [D]: y = rms_norm(x) * (1 +
    weight) over each head's row."""
    n, h, d = x.shape
    if n * h:
        _zc_rms_norm[(n * h,)](x, x, x, weight, y, h, d, x.stride(0), x.stride(1), 0, 0, y.stride(0), y.stride(1), eps,
                               HAS_RES=False, BLOCK=_block(d), num_warps=4 if d >= 1024 else 1)


def add_zc_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, total: torch.Tensor,
                    y: torch.Tensor, eps: float) -> None:
    """total = x + residual (rounded to their dtype); y = rms_norm(total) * (1 + weight). All [N, D]."""
    n, d = x.shape
    if n:
        _zc_rms_norm[(n,)](x, residual, total, weight, y, 1, d, x.stride(0), 0, residual.stride(0), total.stride(0),
                           y.stride(0), 0, eps, HAS_RES=True, BLOCK=_block(d), num_warps=4 if d >= 1024 else 1)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, eps: float) -> None:
    """x and y [N, D] (x fp32 or y's dtype), gate [M, H, D] with M H = N (row r's gate is gate[r // H, r % H];
    rows and heads may be strided, elements contiguous), weight [D]:
    y = (weight * rms_norm(x.to(y.dtype)).to(y.dtype)) * silu(gate.float()), in y's dtype."""
    n, d = x.shape
    if n:
        _gated_rms_norm[(n,)](x, gate, weight, y, d, gate.shape[1], x.stride(0), gate.stride(0), gate.stride(1),
                              y.stride(0), eps, BLOCK=_block(d), num_warps=4 if d >= 1024 else 1)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y: torch.Tensor, eps: float) -> None:
    """x, y [N, D] (rows may be strided, elements contiguous), weight and bias [D]: y = layer_norm(x)."""
    n, d = x.shape
    if n:
        _layer_norm[(n,)](x, x, x, weight, bias, y, d, x.stride(0), 0, 0, y.stride(0), eps, HAS_RES=False,
                          BLOCK=_block(d), num_warps=4 if d >= 1024 else 1)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   total: torch.Tensor, y: torch.Tensor, eps: float) -> None:
    """total = x + residual (rounded to their dtype); y = layer_norm(total). All [N, D]."""
    n, d = x.shape
    if n:
        _layer_norm[(n,)](x, residual, total, weight, bias, y, d, x.stride(0), residual.stride(0), total.stride(0),
                          y.stride(0), eps, HAS_RES=True, BLOCK=_block(d), num_warps=4 if d >= 1024 else 1)


def qk_norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, y: torch.Tensor,
                 eps: float) -> None:
    """x, y [N, heads, D] (heads and rows may be strided), weight [D], cos and sin [N, D] with contiguous
    rows: y = rope(rms_norm(x) * weight) in the rotate-half layout."""
    n, heads, d = x.shape
    if n:
        g, warps = _rope_heads(n)
        _qk_norm_rope[(n * triton.cdiv(heads, g),)](x, weight, cos, sin, y, heads, x.stride(0), x.stride(1),
                                                    y.stride(0), y.stride(1), cos.stride(0), eps, D=d, G=g,
                                                    num_warps=warps)


def q_k_norm_rope(q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, yq: torch.Tensor, yk: torch.Tensor, eps: float, v: torch.Tensor | None = None,
                  yv: torch.Tensor | None = None, pdl: bool = False) -> None:
    """qk_norm_rope of q [N, HQ, D] (weight wq) and k [N, HK, D] (weight wk) in one launch, the same rows'
    cos and sin [N, D]; with v [N, HV, D], yv = v from the same launch. pdl: as rms_norm's."""
    n, hq, d = q.shape
    hk = k.shape[1]
    hv = 0 if v is None else v.shape[1]
    v, yv = (q, yq) if v is None else (v, yv)
    if n:
        g, warps = _rope_heads(n)
        _q_k_norm_rope[(n * (triton.cdiv(hq, g) + triton.cdiv(hk, g) + triton.cdiv(hv, g)),)](
            q, k, v, wq, wk, cos, sin, yq, yk, yv, hq, hk, hv, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), yq.stride(0), yq.stride(1), yk.stride(0), yk.stride(1), yv.stride(0),
            yv.stride(1), cos.stride(0), eps, D=d, G=g, num_warps=warps, **pdl_launch(pdl, q))


def zc_norm_partial_rope(q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, yq: torch.Tensor, yk: torch.Tensor, eps: float) -> None:
    """q [N, HQ, D] and k [N, HK, D] (rows and heads may be strided, elements contiguous), weights [D], cos and
    sin [N, R] with contiguous rows (R even, at most D): yq, yk [N, H, D] = rotate-half rotary on the first R dims
    of each head's zero-centred norm (x * rstd * (1 + w)), in one launch."""
    n, hq, d = q.shape
    if n:
        _zc_norm_partial_rope[(n * (hq + k.shape[1]),)](
            q, k, wq, wk, cos, sin, yq, yk, hq, k.shape[1], q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            yq.stride(0), yq.stride(1), yk.stride(0), yk.stride(1), cos.stride(0), eps, D=d, R=cos.shape[-1],
            BLOCK=_block(d), num_warps=4 if d >= 1024 else 1)


@triton.jit
def _silu_mul(gu_ptr, y_ptr, I, gu_row, y_row, BLOCK: tl.constexpr):
    """One row's BLOCK columns: y = silu(gate) * up, gate = gu[:I], up = gu[I:]; rounded where torch rounds
    (silu's output, then the product)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < I
    BF16: tl.constexpr = y_ptr.dtype.element_ty == tl.bfloat16
    g = tl.load(gu_ptr + row * gu_row + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * gu_row + I + offs, mask=m, other=0.0).to(tl.float32)
    a = _round(g / (1.0 + tl.exp(-g)), BF16)
    tl.store(y_ptr + row * y_row + offs, _round(a * u, BF16).to(y_ptr.dtype.element_ty), mask=m)


SILU_BLOCK = 1024


def silu_mul(gu: torch.Tensor, y: torch.Tensor) -> None:
    """gu [N, 2I] (rows may be strided, columns contiguous), y [N, I]: y = silu(gu[:, :I]) * gu[:, I:]."""
    n, i = y.shape
    if n and i:
        _silu_mul[(n, triton.cdiv(i, SILU_BLOCK))](gu, y, i, gu.stride(0), y.stride(0), BLOCK=SILU_BLOCK, num_warps=4)


@triton.jit
def _snake_beta(x_ptr, a_ptr, b_ptr, y_ptr, C, T, x_batch, x_chan, BLOCK: tl.constexpr):
    """One (batch, channel) row's BLOCK samples: y = x + sin(x e^a)^2 / (e^b + 1e-9), in fp32, rounded once."""
    row = tl.program_id(0)
    c = row % C
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < T
    x = tl.load(x_ptr + (row // C).to(tl.int64) * x_batch + c.to(tl.int64) * x_chan + offs, mask=m,
                other=0.0).to(tl.float32)
    a = tl.exp(tl.load(a_ptr + c).to(tl.float32))
    inv_b = 1.0 / (tl.exp(tl.load(b_ptr + c).to(tl.float32)) + 1e-9)
    s = tl.sin(x * a)
    tl.store(y_ptr + row.to(tl.int64) * T + offs, (x + inv_b * s * s).to(y_ptr.dtype.element_ty), mask=m)


SNAKE_BLOCK = 1024


def snake_beta(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, y: torch.Tensor) -> None:
    """x [B, C, T] (batch and channels may be strided, samples contiguous), alpha and beta [C] (log scale),
    y [B, C, T] contiguous: y = x + sin(x * exp(alpha))^2 / (exp(beta) + 1e-9), per channel."""
    b, c, t = x.shape
    if b * c and t:
        _snake_beta[(b * c, triton.cdiv(t, SNAKE_BLOCK))](x, alpha, beta, y, c, t, x.stride(0), x.stride(1),
                                                         BLOCK=SNAKE_BLOCK, num_warps=4)


def q_k_rope_f32(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, yq: torch.Tensor,
                 yk: torch.Tensor, v: torch.Tensor | None = None, yv: torch.Tensor | None = None) -> None:
    """q [N, HQ, D] and k [N, HK, D] (rows and heads may be strided, elements contiguous), cos and sin [N, D]
    fp32 with contiguous rows: yq, yk = apply_rope(x.float(), cos, sin) rounded to their dtype; with v [N, HV, D],
    yv = v. The outputs are W >= D wide, zeros after D. The products and their sum are not contracted into fused
    multiply-adds, so each rounds in fp32 as torch's three kernels round (equal to the torch path bit for bit)."""
    n, hq, d = q.shape
    hk, w = k.shape[1], yq.shape[-1]
    hv = 0 if v is None else v.shape[1]
    v, yv = (q, yq) if v is None else (v, yv)
    if n:
        g, warps = _rope_heads(n, ROPE_F32_HEADS)
        _q_k_rope_f32[(n * (triton.cdiv(hq, g) + triton.cdiv(hk, g) + triton.cdiv(hv, g)),)](
            q, k, v, cos, sin, yq, yk, yv, hq, hk, hv, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
            v.stride(1), yq.stride(0), yq.stride(1), yk.stride(0), yk.stride(1), yv.stride(0), yv.stride(1),
            cos.stride(0), D=d, W=w, BLOCK_D=triton.next_power_of_2(w), G=g, num_warps=warps, enable_fp_fusion=False)
