"""The fused norm kernels (norm_triton.py) as torch operators, as moe_ops.py does for the MoE kernels:
capture and the compiler's simulation see them (each is one launch; its outputs are allocated by the
caller with torch.empty, which the simulation records). Triton is imported only when one runs on a device.

    graphc::rms_norm(x, weight, y!, eps)
    graphc::add_rms_norm(x, residual, weight, total!, y!, eps)
    graphc::layer_norm(x, weight, bias, y!, eps)
    graphc::add_layer_norm(x, residual, weight, bias, total!, y!, eps)
    graphc::qk_norm_rope(x, weight, cos, sin, y!, eps)
    graphc::q_k_norm_rope(q, k, wq, wk, cos, sin, yq!, yk!, eps, v?, yv!?)
    graphc::q_k_rope_f32(q, k, cos, sin, yq!, yk!, v?, yv!?)
    graphc::snake_beta(x, alpha, beta, y!)
    graphc::silu_mul(gate_up, y!)
    graphc::zc_rms_norm(x, weight, y!, eps)
    graphc::add_zc_rms_norm(x, residual, weight, total!, y!, eps)
    graphc::zc_norm_partial_rope(q, k, wq, wk, cos, sin, yq!, yk!, eps)
    graphc::gated_rms_norm(x, gate, weight, y!, eps)
    graphc::gdn_gates(b, a, a_log, dt_bias, beta!, g!)
    graphc::gdn_conv_row(x, weight, pool!, slots, has_state, y!)
    graphc::gdn_conv_rows(x, weight, pool!, slots, has_state, seq, cu, y!)

layers.RMSNorm takes the first two, layers.LayerNorm the next two, the attention layers' q and k norm +
rotary q_k_norm_rope (qk_norm_rope where only one of them is fused), code2wav.SnakeBeta snake_beta and
layers.SwiGLU silu_mul, where the plan says so (the fused_norms knob: the normalisation-like elementwise
chains of a node as one launch each) and the inputs allow; the vision tower's attention q_k_rope_f32 (the
fused_rope knob). Qwen3.5's zero-centred norms (qwen3_5_text.ZeroCentredRMSNorm: the layer norms, the residual
add with the one after the mixer and with the next layer's, q_norm and k_norm, the final norm) take zc_rms_norm
and add_zc_rms_norm, its gated attention's q_norm and k_norm with the partial rotary after them
zc_norm_partial_rope (the gated_rope knob), and
its Gated DeltaNet layers gated_rms_norm (the output norm, on the core's fp32 rows), gdn_gates (beta and the
log decay) and gdn_conv_row (a decode step's conv on the conv state pool in place; gdn_step_triton.py), under
the gdn_fused knob, on bf16 rows on a device in KERNEL_DEVICES; gdn_conv_rows (any step's conv, rows of several
sequences, on the pool in place) under the gdn_conv_rows knob. The wrappers here check shapes and return the
outputs.
"""
from __future__ import annotations

import torch

# where the kernels run: a GPU, and the meta device the compiler traces them on (the interpreted tests add "cpu")
KERNEL_DEVICES = ("cuda", "meta")


@torch.library.custom_op("graphc::rms_norm", mutates_args=("y",))
def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, eps: float, pdl: bool = False) -> None:
    from models.components import norm_triton as k

    k.rms_norm(x, weight, y, eps, pdl)


@rms_norm_op.register_fake
def _(x, weight, y, eps, pdl=False) -> None:
    return None


@torch.library.custom_op("graphc::add_rms_norm", mutates_args=("total", "y"))
def add_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, total: torch.Tensor,
                    y: torch.Tensor, eps: float, pdl: bool = False) -> None:
    from models.components import norm_triton as k

    k.add_rms_norm(x, residual, weight, total, y, eps, pdl)


@add_rms_norm_op.register_fake
def _(x, residual, weight, total, y, eps, pdl=False) -> None:
    return None


@torch.library.custom_op("graphc::layer_norm", mutates_args=("y",))
def layer_norm_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y: torch.Tensor, eps: float) -> None:
    from models.components import norm_triton as k

    k.layer_norm(x, weight, bias, y, eps)


@layer_norm_op.register_fake
def _(x, weight, bias, y, eps) -> None:
    return None


@torch.library.custom_op("graphc::add_layer_norm", mutates_args=("total", "y"))
def add_layer_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                      total: torch.Tensor, y: torch.Tensor, eps: float) -> None:
    from models.components import norm_triton as k

    k.add_layer_norm(x, residual, weight, bias, total, y, eps)


@add_layer_norm_op.register_fake
def _(x, residual, weight, bias, total, y, eps) -> None:
    return None


@torch.library.custom_op("graphc::qk_norm_rope", mutates_args=("y",))
def qk_norm_rope_op(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, y: torch.Tensor,
                    eps: float) -> None:
    from models.components import norm_triton as k

    k.qk_norm_rope(x, weight, cos, sin, y, eps)


@qk_norm_rope_op.register_fake
def _(x, weight, cos, sin, y, eps) -> None:
    return None


@torch.library.custom_op("graphc::q_k_norm_rope", mutates_args=("yq", "yk", "yv"))
def q_k_norm_rope_op(q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, yq: torch.Tensor, yk: torch.Tensor, eps: float, v: torch.Tensor | None,
                     yv: torch.Tensor | None, pdl: bool = False) -> None:
    from models.components import norm_triton as kern

    kern.q_k_norm_rope(q, k, wq, wk, cos, sin, yq, yk, eps, v, yv, pdl)


@q_k_norm_rope_op.register_fake
def _(q, k, wq, wk, cos, sin, yq, yk, eps, v, yv, pdl=False) -> None:
    return None


@torch.library.custom_op("graphc::zc_norm_partial_rope", mutates_args=("yq", "yk"))
def zc_norm_partial_rope_op(q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, cos: torch.Tensor,
                            sin: torch.Tensor, yq: torch.Tensor, yk: torch.Tensor, eps: float) -> None:
    from models.components import norm_triton as kern

    kern.zc_norm_partial_rope(q, k, wq, wk, cos, sin, yq, yk, eps)


@zc_norm_partial_rope_op.register_fake
def _(q, k, wq, wk, cos, sin, yq, yk, eps) -> None:
    return None


@torch.library.custom_op("graphc::q_k_rope_f32", mutates_args=("yq", "yk", "yv"))
def q_k_rope_f32_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, yq: torch.Tensor,
                    yk: torch.Tensor, v: torch.Tensor | None, yv: torch.Tensor | None) -> None:
    from models.components import norm_triton as kern

    kern.q_k_rope_f32(q, k, cos, sin, yq, yk, v, yv)


@q_k_rope_f32_op.register_fake
def _(q, k, cos, sin, yq, yk, v, yv) -> None:
    return None


@torch.library.custom_op("graphc::snake_beta", mutates_args=("y",))
def snake_beta_op(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, y: torch.Tensor) -> None:
    from models.components import norm_triton as k

    k.snake_beta(x, alpha, beta, y)


@snake_beta_op.register_fake
def _(x, alpha, beta, y) -> None:
    return None


@torch.library.custom_op("graphc::silu_mul", mutates_args=("y",))
def silu_mul_op(gate_up: torch.Tensor, y: torch.Tensor) -> None:
    from models.components import norm_triton as k

    k.silu_mul(gate_up, y)


@silu_mul_op.register_fake
def _(gate_up, y) -> None:
    return None


@torch.library.custom_op("graphc::zc_rms_norm", mutates_args=("y",))
def zc_rms_norm_op(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, eps: float) -> None:
    from models.components import norm_triton as k

    k.zc_rms_norm(x, weight, y, eps)


@zc_rms_norm_op.register_fake
def _(x, weight, y, eps) -> None:
    return None


@torch.library.custom_op("graphc::add_zc_rms_norm", mutates_args=("total", "y"))
def add_zc_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, total: torch.Tensor,
                       y: torch.Tensor, eps: float) -> None:
    from models.components import norm_triton as k

    k.add_zc_rms_norm(x, residual, weight, total, y, eps)


@add_zc_rms_norm_op.register_fake
def _(x, residual, weight, total, y, eps) -> None:
    return None


@torch.library.custom_op("graphc::gated_rms_norm", mutates_args=("y",))
def gated_rms_norm_op(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, eps: float
                      ) -> None:
    from models.components import norm_triton as k

    k.gated_rms_norm(x, gate, weight, y, eps)


@gated_rms_norm_op.register_fake
def _(x, gate, weight, y, eps) -> None:
    return None


@torch.library.custom_op("graphc::gdn_gates", mutates_args=("beta", "g"))
def gdn_gates_op(b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, beta: torch.Tensor,
                 g: torch.Tensor) -> None:
    from models.components import gdn_step_triton as k

    k.gates(b, a, a_log, dt_bias, beta, g)


@gdn_gates_op.register_fake
def _(b, a, a_log, dt_bias, beta, g) -> None:
    return None


@torch.library.custom_op("graphc::gdn_conv_row", mutates_args=("pool", "y"))
def gdn_conv_row_op(x: torch.Tensor, weight: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor,
                    has_state: torch.Tensor, y: torch.Tensor) -> None:
    from models.components import gdn_step_triton as k

    k.conv_row(x, weight, pool, slots, has_state, y)


@gdn_conv_row_op.register_fake
def _(x, weight, pool, slots, has_state, y) -> None:
    return None


@torch.library.custom_op("graphc::gdn_conv_rows", mutates_args=("pool", "y"))
def gdn_conv_rows_op(x: torch.Tensor, weight: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor,
                     has_state: torch.Tensor, seq: torch.Tensor, cu: torch.Tensor, y: torch.Tensor) -> None:
    from models.components import gdn_step_triton as k

    k.conv_rows(x, weight, pool, slots, has_state, seq, cu, y)


@gdn_conv_rows_op.register_fake
def _(x, weight, pool, slots, has_state, seq, cu, y) -> None:
    return None


def on_kernel_device(x: torch.Tensor) -> bool:
    """Whether x lies where the kernels run (KERNEL_DEVICES)."""
    return x.device.type in KERNEL_DEVICES


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] as [N, D] rows, elements contiguous (a copy only where a view cannot be had)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool = False) -> torch.Tensor:
    """layers.RMSNorm's forward: x [..., D] -> [..., D] in x's dtype. pdl: launched with programmatic dependent
    launch (the plan's pdl knob; resources/pdl.py)."""
    x2 = _rows(x)
    y = torch.empty(x2.shape, device=x.device, dtype=x.dtype)
    rms_norm_op(x2, weight, y, eps, pdl)
    return y.view(x.shape)


def _add_norm(name: str, op, x: torch.Tensor, residual: torch.Tensor, params: tuple, eps: float, *launch
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, a norm of it) through op(x, residual, *params, total!, y!, eps, *launch), both [..., D] in
    x's dtype."""
    if x.shape != residual.shape or x.dtype != residual.dtype:
        raise ValueError(f"{name}: x {tuple(x.shape)} {x.dtype} and residual {tuple(residual.shape)} "
                         f"{residual.dtype} differ")
    x2, r2 = _rows(x), _rows(residual)
    total = torch.empty(x2.shape, device=x.device, dtype=x.dtype)
    y = torch.empty(x2.shape, device=x.device, dtype=x.dtype)
    op(x2, r2, *params, total, y, eps, *launch)
    return total.view(x.shape), y.view(x.shape)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, rms_norm(x + residual)), both [..., D] in x's dtype. pdl: as rms_norm's."""
    return _add_norm("add_rms_norm", add_rms_norm_op, x, residual, (weight,), eps, pdl)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """layers.LayerNorm's forward: x [..., D] -> [..., D] in x's dtype."""
    x2 = _rows(x)
    y = torch.empty(x2.shape, device=x.device, dtype=x.dtype)
    layer_norm_op(x2, weight, bias, y, eps)
    return y.view(x.shape)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, layer_norm(x + residual)), both [..., D] in x's dtype."""
    return _add_norm("add_layer_norm", add_layer_norm_op, x, residual, (weight, bias), eps)


def _tables(op: str, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for x [..., heads, D] as [N, D] rows, one per row of x: they must be [..., 1, D] or broadcast
    to it (a table row serving many rows of x is read in place where one stride can say so, else copied), in
    dtype (default: x's)."""
    *rows, _, d = x.shape
    shape = (*rows, 1, d)
    dtype = dtype or x.dtype
    try:
        fits = tuple(torch.broadcast_shapes(cos.shape, shape)) == shape
    except RuntimeError:
        fits = False
    if not fits or cos.shape != sin.shape or cos.dtype != dtype or sin.dtype != dtype:
        raise ValueError(f"{op}: x {tuple(x.shape)} {x.dtype} takes cos and sin of shape {shape} (or broadcasting "
                         f"to it) in {dtype}, not {tuple(cos.shape)} {cos.dtype}, {tuple(sin.shape)} {sin.dtype}")
    return _rows(cos.expand(shape)), _rows(sin.expand(shape))


def _heads(x: torch.Tensor) -> torch.Tensor:
    """x [..., heads, D] as [N, heads, D], elements contiguous (rows and heads may be strided)."""
    x3 = x.reshape(-1, *x.shape[-2:])
    return x3 if x3.stride(-1) == 1 else x3.contiguous()


def qk_norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
                 ) -> torch.Tensor:
    """apply_rope(rms_norm(x) * weight, cos, sin): x [..., heads, D], cos and sin [..., 1, D] or broadcasting
    to it -> [..., heads, D] in x's dtype."""
    c2, s2 = _tables("qk_norm_rope", x, cos, sin)
    x3 = _heads(x)
    y = torch.empty(x3.shape, device=x.device, dtype=x.dtype)
    qk_norm_rope_op(x3, weight, c2, s2, y, eps)
    return y.view(x.shape)


def head_rows(y: torch.Tensor) -> torch.Tensor | None:
    """y [..., heads, D] as a view [N, heads, D] with contiguous elements (one stride per dim), or None where
    its rows cannot be said with one stride (then it cannot be a kernel's output in place)."""
    try:
        y3 = y.view(-1, *y.shape[-2:])
    except RuntimeError:
        return None
    return y3 if y3.stride(-1) == 1 else None


def q_k_norm_rope(q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, eps: float, out: tuple[torch.Tensor, ...] | None = None,
                  v: torch.Tensor | None = None, pdl: bool = False) -> tuple[torch.Tensor, ...]:
    """(qk_norm_rope(q, wq, ...), qk_norm_rope(k, wk, ...)) in one launch (pdl: as rms_norm's): q [..., HQ, D] and k [..., HK, D] of
    the same rows, cos and sin as qk_norm_rope takes them. out: (yq, yk) shaped as q and k to hold the results
    (returned): written in place where their rows take one stride each (head_rows; the code predictor's
    frame-cache slots of one sequence or one slot), else written beside and copied in. With v [..., HV, D] of the
    same rows, out is (yq, yk, yv) and v's copy into yv comes from the same launch."""
    _check_q_k_v(q, k, v, out)
    c2, s2 = _tables("q_k_norm_rope", q, cos, sin)
    xs = [_heads(x) for x in (q, k) + (() if v is None else (v,))]
    ys = None if out is None else [head_rows(y) for y in out]
    in_place = ys is not None and all(y is not None for y in ys)
    if not in_place:
        ys = [torch.empty(x.shape, device=x.device, dtype=x.dtype) for x in xs]
    v3, yv = (xs[2], ys[2]) if v is not None else (None, None)
    q_k_norm_rope_op(xs[0], xs[1], wq, wk, c2, s2, ys[0], ys[1], eps, v3, yv, pdl)
    if in_place:
        return out
    got = tuple(y.view(x.shape) for x, y in zip((q, k, v), ys))
    if out is None:
        return got
    for o, y in zip(out, got):
        o.copy_(y)
    return out


def zc_norm_partial_rope(q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3.5's gated attention: (apply_partial_rope(zc_rms_norm(q, wq), cos, sin), the same of k with wk) in one
    launch: q [..., HQ, D] and k [..., HK, D] of the same rows and dtype (heads may be strided views of the
    projection), cos and sin [..., 1, R] (R even, at most D) or broadcasting to it, in q's dtype -> [..., H, D]."""
    r = cos.shape[-1]
    if (k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1] or k.dtype != q.dtype or r % 2 or r > q.shape[-1]
            or wq.shape != (q.shape[-1],) or wk.shape != wq.shape):
        raise ValueError(f"zc_norm_partial_rope: q {tuple(q.shape)} {q.dtype} and k {tuple(k.shape)} {k.dtype} must "
                         f"share their rows, head dim and dtype, with weights of the head dim (got {tuple(wq.shape)}, "
                         f"{tuple(wk.shape)}) and an even rotary width at most it (cos {tuple(cos.shape)})")
    c2, s2 = _tables("zc_norm_partial_rope", q[..., :r], cos, sin)
    xq, xk = _heads(q), _heads(k)
    yq, yk = (torch.empty(x.shape, device=x.device, dtype=x.dtype) for x in (xq, xk))
    zc_norm_partial_rope_op(xq, xk, wq, wk, c2, s2, yq, yk, eps)
    return yq.view(q.shape), yk.view(k.shape)


def _check_q_k_v(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, out: tuple[torch.Tensor, ...] | None
                 ) -> None:
    """q_k_norm_rope's refusals: q, k (and v) must share rows, head dim and dtype; out holds one of each."""
    xs = (q, k) + (() if v is None else (v,))
    if any(x.shape[:-2] != q.shape[:-2] or x.shape[-1] != q.shape[-1] or x.dtype != q.dtype for x in xs):
        raise ValueError(f"q_k_norm_rope: q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}"
                         f"{'' if v is None else f' and v {tuple(v.shape)} {v.dtype}'} must share their rows, head dim "
                         "and dtype")
    if v is not None and out is None:
        raise ValueError("q_k_norm_rope: v is copied into out's third tensor; pass out = (yq, yk, yv)")
    if out is not None and (len(out) != len(xs) or any(y.shape != x.shape or y.dtype != x.dtype
                                                          for y, x in zip(out, xs))):
        raise ValueError(f"q_k_norm_rope: out {[tuple(y.shape) for y in out]} must be shaped as q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}{'' if v is None else f' and v {tuple(v.shape)}'}, in their dtype")


def q_k_rope_f32(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, v: torch.Tensor | None = None,
                 width: int | None = None) -> tuple[torch.Tensor, ...]:
    """(apply_rope(q.float(), cos, sin).to(q.dtype), the same of k) in one launch: q [..., HQ, D] and k [..., HK, D]
    of the same rows and dtype, cos and sin fp32 [..., 1, D] or broadcasting to it (the vision encoder's). With v
    [..., HV, D], a copy of it comes third, from the same launch. With width (>= D), each comes [..., H, width],
    zeros after D: the copies an attention kernel that runs the head dim padded needs, without its pads."""
    d = q.shape[-1]
    width = d if width is None else width
    if k.shape[:-2] != q.shape[:-2] or k.shape[-1] != d or k.dtype != q.dtype or (v is not None and (
            v.shape[:-2] != q.shape[:-2] or v.shape[-1] != d or v.dtype != q.dtype)):
        raise ValueError(f"q_k_rope_f32: q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}"
                         f"{'' if v is None else f' and v {tuple(v.shape)} {v.dtype}'} must share their rows, head dim "
                         "and dtype")
    if width < d:
        raise ValueError(f"q_k_rope_f32: width {width} is narrower than the head dim {d}; it pads, never cuts")
    c2, s2 = _tables("q_k_rope_f32", q, cos, sin, torch.float32)
    xs = [_heads(x) for x in (q, k) + (() if v is None else (v,))]
    ys = [torch.empty((*x.shape[:-1], width), device=x.device, dtype=x.dtype) for x in xs]
    v3, yv = (xs[2], ys[2]) if v is not None else (None, None)
    q_k_rope_f32_op(xs[0], xs[1], c2, s2, ys[0], ys[1], v3, yv)
    return tuple(y.view(*x.shape[:-1], width) for x, y in zip((q, k, v), ys))


def snake_beta(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """code2wav.SnakeBeta's forward: x [B, C, T] -> [B, C, T] in x's dtype (samples contiguous; a copy
    only where they are not)."""
    if x.dim() != 3 or alpha.shape != (x.shape[1],) or beta.shape != alpha.shape:
        raise ValueError(f"snake_beta: x {tuple(x.shape)} takes alpha and beta of its {x.shape[1:2]} channels, not "
                         f"{tuple(alpha.shape)} and {tuple(beta.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    snake_beta_op(x, alpha, beta, y)
    return y


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """layers.SwiGLU's activation: gate_up [..., 2I] (gate's columns, then up's) -> silu(gate) * up [..., I]
    in its dtype."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"silu_mul: gate_up {tuple(gate_up.shape)} must hold gate's and up's columns, an even count")
    g2 = _rows(gate_up)
    y = torch.empty((g2.shape[0], g2.shape[1] // 2), device=gate_up.device, dtype=gate_up.dtype)
    silu_mul_op(g2, y)
    return y.view(*gate_up.shape[:-1], y.shape[-1])


def zc_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """qwen3_5_text.ZeroCentredRMSNorm's forward, rms_norm(x) * (1 + weight): x [..., D] (or [..., H, D], each
    head's row normed; heads may be strided views, as q and k of a projection) -> [..., D] in x's dtype."""
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"zc_rms_norm: x {tuple(x.shape)} takes a weight of its last dim, not {tuple(weight.shape)}")
    x3 = _heads(x if x.dim() > 2 else x.reshape(-1, 1, x.shape[-1]))
    y = torch.empty(x3.shape, device=x.device, dtype=x.dtype)
    zc_rms_norm_op(x3, weight, y, eps)
    return y.view(x.shape)


def add_zc_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, zc_rms_norm(x + residual)), both [..., D] in x's dtype."""
    return _add_norm("add_zc_rms_norm", add_zc_rms_norm_op, x, residual, (weight,), eps)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """gated_deltanet.GatedRMSNorm's forward: x [..., D] (the core's fp32 output, or rows in gate's dtype) rounded
    to gate's dtype, then (weight * rms_norm(x)) * silu(gate) -> [..., D] in gate's dtype."""
    if x.shape != gate.shape or weight.shape != (x.shape[-1],):
        raise ValueError(f"gated_rms_norm: x {tuple(x.shape)}, gate {tuple(gate.shape)} and weight "
                         f"{tuple(weight.shape)} must be [..., D], [..., D] and [D]")
    x2 = _rows(x)
    g3 = gate.reshape(-1, *gate.shape[-2:]) if gate.dim() >= 3 else _rows(gate)[:, None]     # [M, H, D]
    g3 = g3 if g3.stride(-1) == 1 else g3.contiguous()
    y = torch.empty(x2.shape, device=gate.device, dtype=gate.dtype)
    gated_rms_norm_op(x2, g3, weight, y, eps)
    return y.view(gate.shape)


def gdn_gates(b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gated DeltaNet's gates of b and a [T, HV] (in_proj_b's and in_proj_a's rows): (beta = sigmoid(b) in
    b's dtype, g = -exp(a_log) * softplus(a + dt_bias) in fp32), each [T, HV] contiguous."""
    hv = a_log.shape[0]
    if b.dim() != 2 or b.shape != a.shape or b.shape[1] != hv or dt_bias.shape != (hv,):
        raise ValueError(f"gdn_gates: b {tuple(b.shape)} and a {tuple(a.shape)} must be [T, HV] with a_log "
                         f"{tuple(a_log.shape)} and dt_bias {tuple(dt_bias.shape)} [HV]")
    b2, a2 = _rows(b), _rows(a)
    beta = torch.empty(b.shape, device=b.device, dtype=b.dtype)
    g = torch.empty(b.shape, device=b.device, dtype=torch.float32)
    gdn_gates_op(b2, a2, a_log, dt_bias, beta, g)
    return beta, g


def gdn_conv_rows(x: torch.Tensor, weight: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor,
                  has_state: torch.Tensor, seq: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """Any step's causal conv (delta_rule.causal_conv) on the conv state pool in place: x [T, C] (sequence n's rows
    cu[n]:cu[n+1], seq [T] each row's sequence), weight [C, K], pool [slots, C, K-1] whose slot slots[n] holds
    sequence n's last K-1 rows (read as zeros where has_state[n] is False) and takes its new window. Returns
    silu(conv) [T, C] in x's dtype."""
    t, c = x.shape
    n = slots.shape[0]
    if weight.dim() != 2 or weight.shape[0] != c or weight.shape[1] < 2 or pool.dim() != 3 or \
            pool.shape[1:] != (c, weight.shape[1] - 1) or has_state.shape != (n,) or cu.shape != (n + 1,) or \
            seq.shape != (t,):
        raise ValueError(f"gdn_conv_rows: x {tuple(x.shape)} takes weight [C, K] (K >= 2), pool [slots, C, K-1], "
                         f"slots and has_state [N], cu [N+1] and seq [T]; got weight {tuple(weight.shape)}, pool "
                         f"{tuple(pool.shape)}, slots {tuple(slots.shape)}, has_state {tuple(has_state.shape)}, cu "
                         f"{tuple(cu.shape)}, seq {tuple(seq.shape)}")
    x2 = _rows(x)
    w2 = weight if weight.stride(-1) == 1 else weight.contiguous()
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    gdn_conv_rows_op(x2, w2, pool, slots, has_state, seq, cu, y)
    return y


def gdn_conv_row(x: torch.Tensor, weight: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor,
                 has_state: torch.Tensor) -> torch.Tensor:
    """A decode step's causal conv (delta_rule.causal_conv of one row a sequence) on the conv state pool in
    place: x [N, C] (sequence i's new row), weight [C, K], pool [slots, C, K-1] whose slot slots[i] holds
    sequence i's last K-1 rows (read as zeros where has_state[i] is False) and takes its new window. Returns
    silu(conv) [N, C] in x's dtype."""
    n, c = x.shape
    if weight.dim() != 2 or weight.shape[0] != c or weight.shape[1] < 2 or pool.dim() != 3 or \
            pool.shape[1:] != (c, weight.shape[1] - 1) or slots.shape != (n,) or has_state.shape != (n,):
        raise ValueError(f"gdn_conv_row: x {tuple(x.shape)} takes weight [C, K] (K >= 2), pool [slots, C, K-1] and "
                         f"slots and has_state [N]; got weight {tuple(weight.shape)}, pool {tuple(pool.shape)}, "
                         f"slots {tuple(slots.shape)}, has_state {tuple(has_state.shape)}")
    x2 = _rows(x)
    w2 = weight if weight.stride(-1) == 1 else weight.contiguous()
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    gdn_conv_row_op(x2, w2, pool, slots, has_state, y)
    return y
