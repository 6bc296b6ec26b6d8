"""Small building blocks: RMSNorm, rotary embedding, SwiGLU."""
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
            return rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def add(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, this norm of it): a residual add and the next pre-norm, one launch where fused."""
        if self.fused(x) and delta.shape == x.shape and delta.dtype == x.dtype:
            from models.components.norm_ops import add_rms_norm
            return add_rms_norm(x, delta, self.weight, self.eps)
        total = x + delta
        return total, self(total)


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


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
