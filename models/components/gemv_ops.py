"""The one-row linear kernel (gemv_triton.py) as a torch operator, as norm_ops.py does for the norm kernels:
capture and the compiler's simulation see it as one launch whose output the caller allocates with
torch.empty. Triton is imported only when it runs on a device.

    graphc::gemv(x, weight, bias, y!)             y = x @ weight^T (+ bias), x [1, K]
    graphc::gemv_silu_mul(x, weight, y!)          y = silu(g) * u, [g | u] = x @ weight^T, weight [2I, K]

layers.Linear takes gemv where the plan says so (the gemv knob) and the step has one row; layers.SwiGLU
gemv_silu_mul (the gemv_swiglu knob).
"""
from __future__ import annotations

import torch


@torch.library.custom_op("graphc::gemv", mutates_args=("y",))
def gemv_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor, pdl: bool = False
            ) -> None:
    from models.components import gemv_triton as k

    k.gemv(x, weight, bias, y, pdl=pdl)


@gemv_op.register_fake
def _(x, weight, bias, y, pdl=False) -> None:
    return None


@torch.library.custom_op("graphc::gemv_silu_mul", mutates_args=("y",))
def gemv_silu_mul_op(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, pdl: bool = False) -> None:
    from models.components import gemv_triton as k

    k.gemv_silu_mul(x, weight, y, pdl=pdl)


@gemv_silu_mul_op.register_fake
def _(x, weight, y, pdl=False) -> None:
    return None


def _check(x: torch.Tensor, weight: torch.Tensor, what: str) -> None:
    if x.shape[0] != 1 or weight.shape[1] != x.shape[1] or not weight.is_contiguous() or x.stride(1) != 1:
        raise ValueError(f"{what} takes one row x [1, K] with contiguous elements and a contiguous weight [N, K]; got "
                         f"x {list(x.shape)} strides {list(x.stride())}, weight {list(weight.shape)}")


def gemv_silu_mul(x: torch.Tensor, weight: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """x [1, K] (elements contiguous) @ weight [2I, K]^T = [g | u] -> silu(g) * u [1, I]. pdl: launched with
    programmatic dependent launch (the plan's pdl knob; resources/pdl.py)."""
    _check(x, weight, "gemv_silu_mul")
    if weight.shape[0] % 2:
        raise ValueError(f"gemv_silu_mul: weight {list(weight.shape)} has an odd row count; a SwiGLU's gate_up "
                         f"weight holds gate's rows then up's")
    y = torch.empty(1, weight.shape[0] // 2, dtype=x.dtype, device=x.device)
    gemv_silu_mul_op(x, weight, y, pdl)
    return y


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pdl: bool = False) -> torch.Tensor:
    """x [1, K] (elements contiguous) @ weight [N, K]^T (+ bias [N]) -> [1, N]. pdl: as gemv_silu_mul's."""
    m, k = x.shape
    n = weight.shape[0]
    _check(x, weight, "gemv")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"gemv: bias {list(bias.shape)} is not [{n}]")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    gemv_op(x, weight, bias, y, pdl)
    return y
