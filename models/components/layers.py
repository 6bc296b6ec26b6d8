"""Small building blocks: RMSNorm, LayerNorm, rotary embedding, SwiGLU."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Qwen-style RMSNorm: normalise in fp32, scale in the input dtype."""

    # a kernel choice the plan makes (graphc/passes/select_backends.py; set on the module at boot and in the
    # simulation): 1 runs bf16 rows on a GPU (and on meta tensors, where the compiler traces them) through
    # one fused launch (norm_ops.py) in place of torch's eight; 0: never
    fused_norms: int = 0
    # the plan's knob (as fused_norms): 1 launches the fused kernels with programmatic dependent launch
    # (resources/pdl.py: the next kernel starts while this one runs, and waits for its writes)
    pdl: int = 0

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def fused(self, x: torch.Tensor) -> bool:
        """Whether x's rows take the fused kernels."""
        return (bool(self.fused_norms) and x.dtype == torch.bfloat16 and self.weight.dtype == x.dtype
                and x.device.type in ("cuda", "meta") and x.shape[-1] == self.weight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused(x):
            from models.components.norm_ops import rms_norm
            return rms_norm(x, self.weight, self.eps, bool(self.pdl))
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def add(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, this norm of it): a residual add and the next pre-norm, one launch where fused."""
        if self.fused(x) and delta.shape == x.shape and delta.dtype == x.dtype:
            from models.components.norm_ops import add_rms_norm
            return add_rms_norm(x, delta, self.weight, self.eps, bool(self.pdl))
        total = x + delta
        return total, self(total)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (the same parameters and checkpoint names) that runs bf16 rows on a GPU (and on meta
    tensors) in one Triton launch where the plan's fused_norms knob says so (norm_ops.layer_norm), and a
    residual add with it in one (add)."""

    fused_norms: int = 0      # the plan's knob, as RMSNorm's

    def fused(self, x: torch.Tensor) -> bool:
        return (bool(self.fused_norms) and x.dtype == torch.bfloat16 and self.weight is not None
                and self.bias is not None and self.weight.dtype == x.dtype and x.device.type in ("cuda", "meta")
                and self.normalized_shape == (x.shape[-1],))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused(x):
            from models.components.norm_ops import layer_norm
            return layer_norm(x, self.weight, self.bias, self.eps)
        return super().forward(x)

    def add(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, this norm of it): a residual add and the next pre-norm, one launch where fused."""
        if self.fused(x) and delta.shape == x.shape and delta.dtype == x.dtype:
            from models.components.norm_ops import add_layer_norm
            return add_layer_norm(x, delta, self.weight, self.bias, self.eps)
        total = x + delta
        return total, self(total)


class Linear(nn.Linear):
    """nn.Linear (the same parameters and checkpoint names) whose one-row steps stream the weight through
    one Triton kernel (gemv_ops.py) where the plan says so."""

    # the plan's knob (graphc/passes/select_backends.py, as RMSNorm's fused_norms): 1 runs a bf16 input of
    # one row on a GPU (and on meta tensors) through the one-row kernel, more rows through cuBLAS; 0: never
    gemv: int = 0
    # the plan's knob (as RMSNorm's pdl): the one-row kernel launched with programmatic dependent launch
    pdl: int = 0
    # the plan's knob: 1 takes a pre-normed one-row input's norm (and the residual add before it) into the
    # one-row kernel's programs (after_norm; for SwiGLU's gate_up_proj, its one-launch product and activation)
    norm_gemv: int = 0
    # the plan's knob: the most rows (0: none) a bf16 input on a GPU (or meta) of 2 rows or more runs through the
    # few-rows kernel (gemv_ops.gemm_rows: each weight row read once, the rows on the tensor cores), not cuBLAS
    gemm_rows: int = 0
    # the plan's knob: 1 takes a pre-normed few-rows input's norm (and the residual add before it; for SwiGLU's
    # gate_up_proj, the activation too) into the few-rows kernel's programs (after_norm, gemv_ops.norm_gemm_rows)
    norm_rows: int = 0

    def one_row(self, x: torch.Tensor) -> bool:
        """The plan runs this input through the one-row kernel: the gemv knob, one bf16 row on a GPU (or meta)."""
        k, w = x.shape[-1], self.weight
        return bool(self.gemv and x.numel() == k == self.in_features and x.dtype == torch.bfloat16 == w.dtype
                    and w.is_contiguous() and x.device.type in ("cuda", "meta"))

    def few_rows(self, x: torch.Tensor) -> bool:
        """The plan runs this input through the few-rows kernel: 2 to the gemm_rows knob's rows, as one_row's."""
        k, w = x.shape[-1], self.weight
        return bool(2 * k <= x.numel() <= min(self.gemm_rows, 64) * k and k == self.in_features
                    and x.dtype == torch.bfloat16 == w.dtype and w.is_contiguous()
                    and x.device.type in ("cuda", "meta"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, w = x.shape[-1], self.weight
        if self.one_row(x):
            from models.components.gemv_ops import gemv
            return gemv(x.reshape(1, k).contiguous(), w, self.bias, bool(self.pdl)).view(*x.shape[:-1],
                                                                                          self.out_features)
        if self.few_rows(x):
            from models.components.gemv_ops import gemm_rows
            rows = x.reshape(-1, k)                      # a view where x's rows allow: the kernel takes a row stride
            y = gemm_rows(rows if rows.stride(1) == 1 else rows.contiguous(), w, self.bias, bool(self.pdl))
            return y.view(*x.shape[:-1], self.out_features)
        return F.linear(x, w, self.bias)

    def folds(self, norm: nn.Module, x: torch.Tensor, delta: torch.Tensor | None) -> bool:
        """after_norm runs in one launch: the norm_gemv knob, this input's one-row kernel, an RMSNorm on its fused
        kernels, a row of at most 4,096 (the norm's, in each program) and a residual of x's shape and dtype."""
        return (bool(self.norm_gemv) and self.one_row(x) and type(norm) is RMSNorm and norm.fused(x)
                and x.shape[-1] <= 4096 and (delta is None or (delta.shape == x.shape and delta.dtype == x.dtype)))

    def folds_rows(self, norm: nn.Module, x: torch.Tensor, delta: torch.Tensor | None) -> bool:
        """after_norm runs in one few-rows launch: the norm_rows knob, this input's few-rows kernel, an RMSNorm on
        its fused kernels and a residual of x's shape and dtype."""
        return (bool(self.norm_rows) and self.few_rows(x) and type(norm) is RMSNorm and norm.fused(x)
                and (delta is None or (delta.shape == x.shape and delta.dtype == x.dtype)))

    def after_norm(self, x: torch.Tensor, delta: torch.Tensor | None, norm: RMSNorm
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """(t, self(norm(t))) for t = x + delta (x where delta is None): one launch where folds() or
        folds_rows(), else the norm's (RMSNorm.add) and this product's."""
        if self.folds(norm, x, delta):
            return _norm_gemv(x, delta, norm, self.weight, self.bias, False, bool(self.pdl), self.out_features)
        if self.folds_rows(norm, x, delta):
            return _norm_rows(x, delta, norm, self.weight, self.bias, False, bool(self.pdl), self.out_features)
        total, h = (x, norm(x)) if delta is None else norm.add(x, delta)
        return total, self(h)


def _norm_gemv(x: torch.Tensor, delta: torch.Tensor | None, norm: RMSNorm, w: torch.Tensor, b: torch.Tensor | None,
               swiglu: bool, pdl: bool, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gemv_ops.norm_gemv on x's one row, its outputs in x's leading shape (y `width` wide)."""
    from models.components.gemv_ops import norm_gemv
    k = x.shape[-1]
    row = delta.reshape(1, k).contiguous() if delta is not None else None
    total, y = norm_gemv(x.reshape(1, k).contiguous(), row, norm.weight, norm.eps, w, b, swiglu, pdl)
    return total.view(x.shape), y.view(*x.shape[:-1], width)


def _norm_rows(x: torch.Tensor, delta: torch.Tensor | None, norm: RMSNorm, w: torch.Tensor, b: torch.Tensor | None,
               swiglu: bool, pdl: bool, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gemv_ops.norm_gemm_rows on x's rows, its outputs in x's leading shape (y `width` wide)."""
    from models.components.gemv_ops import norm_gemm_rows
    k = x.shape[-1]
    rows = [t.reshape(-1, k) for t in (x, delta) if t is not None]
    rows = [r if r.stride(1) == 1 else r.contiguous() for r in rows]
    total, y = norm_gemm_rows(rows[0], rows[1] if delta is not None else None, norm.weight, norm.eps, w, b, swiglu,
                              pdl)
    return total.view(x.shape), y.view(*x.shape[:-1], width)


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T] -> cos, sin [T, 1, D] in the half-split layout (cat(freqs, freqs))."""
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]  # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]: rotate-half rotary embedding."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _broadcasts(t: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """Whether t broadcasts to shape without growing it."""
    try:
        return tuple(torch.broadcast_shapes(t.shape, shape)) == tuple(shape)
    except RuntimeError:
        return False


def norm_rope(norm: RMSNorm, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rope(norm(x), cos, sin) for x [..., heads, D] (Qwen3's qk-norm): one fused launch where the
    norm is fused and the shapes allow (a power-of-two D; cos and sin broadcast to [..., 1, D], in x's dtype:
    the code predictor's [n, 1, D] tables serve its [S, n] rows)."""
    d = x.shape[-1]
    if (norm.fused(x) and d & (d - 1) == 0 and _broadcasts(cos, (*x.shape[:-2], 1, d))
            and cos.shape == sin.shape and cos.dtype == sin.dtype == x.dtype):
        from models.components.norm_ops import qk_norm_rope
        return qk_norm_rope(x, norm.weight, cos, sin, norm.eps)
    return apply_rope(norm(x), cos, sin)


def split_qkv(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fused projection's output [..., (heads + 2 kv_heads) D] -> q [..., heads, D], k and v [..., kv_heads, D],
    views of it (rows strided: the kernels after it take strides)."""
    rows, q_end, k_end = qkv.shape[:-1], heads * head_dim, (heads + kv_heads) * head_dim
    return (qkv[..., :q_end].view(*rows, heads, head_dim), qkv[..., q_end:k_end].view(*rows, kv_heads, head_dim),
            qkv[..., k_end:].view(*rows, kv_heads, head_dim))


def norm_rope_qk(q_norm: RMSNorm, k_norm: RMSNorm, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, out: tuple[torch.Tensor, ...] | None = None, v: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, ...]:
    """(norm_rope(q_norm, q, ...), norm_rope(k_norm, k, ...)): one fused launch for both where each would
    take the fused kernel and their rows and eps agree. out: (yq, yk) shaped as q and k to hold the results
    (returned): the fused launch writes them in place where their rows allow (norm_ops.q_k_norm_rope), the
    torch path copies them in. With v, out is (yq, yk, yv) and v is copied into yv, by the same launch where
    it is fused."""
    d = q.shape[-1]
    if (q_norm.fused(q) and k_norm.fused(k) and q_norm.eps == k_norm.eps and d & (d - 1) == 0
            and k.shape[-1] == d and k.shape[:-2] == q.shape[:-2] and _broadcasts(cos, (*q.shape[:-2], 1, d))
            and cos.shape == sin.shape and cos.dtype == sin.dtype == q.dtype):
        from models.components.norm_ops import q_k_norm_rope
        return q_k_norm_rope(q, k, q_norm.weight, k_norm.weight, cos, sin, q_norm.eps, out, v, bool(q_norm.pdl))
    got = (norm_rope(q_norm, q, cos, sin), norm_rope(k_norm, k, cos, sin)) + (() if v is None else (v,))
    if out is None:
        return got
    for o, y in zip(out, got, strict=True):
        o.copy_(y)
    return out


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up as one matrix (gate's rows, then up's: one GEMM; the
    checkpoint's gate_proj and up_proj are stacked at load, graphc/runtime/checkpoint.py)."""

    # the plan's knob (as RMSNorm's): 1 runs bf16 rows on a GPU (and on meta tensors) through one fused
    # activation launch (norm_ops.silu_mul) in place of torch's silu and product
    fused_norms: int = 0
    # the plan's knob: a one-row bf16 input's gate_up product and activation run as one launch
    # (gemv_ops.gemv_silu_mul) where the gate_up product would take the one-row kernel (Linear's gemv knob) and
    # its weight holds at most this many bytes; 0: never
    gemv_swiglu: int = 0
    # the plan's knob (as RMSNorm's pdl): gemv_silu_mul launched with programmatic dependent launch
    pdl: int = 0

    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias=bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)

    def one_launch(self, x: torch.Tensor) -> bool:
        """x's gate_up product and activation run as one launch (the gemv_swiglu knob, gemv_silu_mul)."""
        gu = self.gate_up_proj
        w = gu.weight
        return 0 < w.numel() * w.element_size() <= self.gemv_swiglu and gu.bias is None and gu.one_row(x)

    def after_norm(self, x: torch.Tensor, delta: torch.Tensor | None, norm: RMSNorm
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """(t, self(norm(t))) for t = x + delta (x where delta is None); the norm rides in the gate_up launch where
        that is one launch and gate_up_proj.folds() (Linear.after_norm), or, with gate_up_proj.folds_rows(), in one
        few-rows launch of the norm, the gate_up product and the activation; else the norm's own launch."""
        gu = self.gate_up_proj
        if self.one_launch(x) and gu.folds(norm, x, delta):
            total, a = _norm_gemv(x, delta, norm, gu.weight, None, True, bool(self.pdl), gu.out_features // 2)
            return total, self.down_proj(a)
        if gu.bias is None and gu.folds_rows(norm, x, delta):
            total, a = _norm_rows(x, delta, norm, gu.weight, None, True, bool(self.pdl), gu.out_features // 2)
            return total, self.down_proj(a)
        total, h = (x, norm(x)) if delta is None else norm.add(x, delta)
        return total, self(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gu = self.gate_up_proj
        w = gu.weight
        if self.one_launch(x):
            from models.components.gemv_ops import gemv_silu_mul
            k = x.shape[-1]
            return self.down_proj(gemv_silu_mul(x.reshape(1, k).contiguous(), w, bool(self.pdl)).view(*x.shape[:-1],
                                                                                                     -1))
        gate_up = gu(x)
        if self.fused_norms and gate_up.dtype == torch.bfloat16 and gate_up.device.type in ("cuda", "meta"):
            from models.components.norm_ops import silu_mul
            return self.down_proj(silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def splice(x: torch.Tensor, embeds: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x [T, H] with the rows where rows >= 0 replaced by embeds[rows] (embeds [N, H], N >= 1)."""
    picked = embeds.to(x.dtype).index_select(0, rows.clamp(min=0))        # [T, H]
    return torch.where((rows >= 0)[:, None], picked, x)


def add_at(x: torch.Tensor, embeds: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x [T, H] plus embeds[rows] where rows >= 0 (the deepstack addition)."""
    picked = embeds.to(x.dtype).index_select(0, rows.clamp(min=0))
    return x + torch.where((rows >= 0)[:, None], picked, 0.0)
