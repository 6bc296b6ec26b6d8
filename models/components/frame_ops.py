"""The code predictor's fused frame attention (frame_triton.py) as a torch operator, as norm_ops.py does for the
norm kernels: capture and the compiler's simulation see one launch. Triton is imported only when it runs.

    graphc::frame_attend(q, k, v, wq, wk, cos, sin, qc!, kc!, vc!, o!, first, eps, pdl)

frame_attend (below) checks the shapes and allocates the output; talker.FrameAttend calls it under the talker's
frame_attend knob, in place of q_k_norm_rope and the cp_attn resource's attention.
"""
from __future__ import annotations

import torch


# no argument has a default (tests/unit/test_custom_ops.py says why)
@torch.library.custom_op("graphc::frame_attend", mutates_args=("qc", "kc", "vc", "o"))
def frame_attend_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor,
                    cos: torch.Tensor, sin: torch.Tensor, qc: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                    o: torch.Tensor, first: int, eps: float, pdl: bool) -> None:
    from models.components import frame_triton as kern
    kern.frame_attend(q, k, v, wq, wk, cos, sin, qc, kc, vc, o, first, eps, pdl)


@frame_attend_op.register_fake
def _(q, k, v, wq, wk, cos, sin, qc, kc, vc, o, first, eps, pdl) -> None:
    return None


def frame_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                 first: int, eps: float, pdl: bool) -> torch.Tensor:
    """The attention output [S, N, HQ, D] of the step's rows q [S, N, HQ, D], k and v [S, N, HK, D] at slots
    first .. first + N - 1 of each sequence's frame, after their q and k are normed (weights wq, wk [D]) and
    rotated (cos, sin [N, 1, D] or [N, D]: those slots' rows) and written with v into cache = (qc, kc, vc)
    [S, G, heads, D] at those slots. Causal over the frame's slots, scaled by 1 / sqrt(D)."""
    _check(q, k, v, wq, wk, cos, sin, cache, first)
    o = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    n, d = q.shape[1], q.shape[3]
    frame_attend_op(q, k, v, wq, wk, cos.reshape(n, d), sin.reshape(n, d), *cache, o, first, eps, pdl)
    return o


def _check(q, k, v, wq, wk, cos, sin, cache, first) -> None:
    """frame_attend's refusals, each naming what it got and what it needs."""
    s, n, hq, d = q.shape
    hk = k.shape[2]
    if k.shape != (s, n, hk, d) or v.shape != k.shape or hq % hk or any(x.stride(-1) != 1 for x in (q, k, v)):
        raise ValueError(f"frame_attend: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: want [S, N, "
                         "heads, D] each with the same S, N and D, contiguous heads, and q's heads a multiple of k's")
    if d & (d - 1) or wq.shape != (d,) or wk.shape != (d,):
        raise ValueError(f"frame_attend: head dim {d} (a power of two) with norm weights {tuple(wq.shape)} and "
                         f"{tuple(wk.shape)}: want [{d}] each")
    if cos.numel() != n * d or sin.shape != cos.shape or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError(f"frame_attend: cos {tuple(cos.shape)} and sin {tuple(sin.shape)}: want the {n} slots' "
                         f"contiguous rows of {d}")
    qc, kc, vc = cache
    g = kc.shape[1]
    if qc.shape != (s, g, hq, d) or kc.shape != (s, g, hk, d) or vc.shape != kc.shape or not 0 <= first <= g - n:
        raise ValueError(f"frame_attend: cache {[tuple(c.shape) for c in cache]} at slots {first}..{first + n - 1}: "
                         f"want [{s}, G, {hq} / {hk}, {d}] with the slots inside G")
    if any(x.dtype != q.dtype for x in (k, v, *cache)) or any(c.stride(-1) != 1 for c in cache):
        raise ValueError("frame_attend: q, k, v and the cache must share one dtype, each with contiguous heads")
