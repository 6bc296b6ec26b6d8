"""The one-row linear kernel (gemv_triton.py) as a torch operator, as norm_ops.py does for the norm kernels:
capture and the compiler's simulation see it as one launch whose output the caller allocates with
torch.empty. Triton is imported only when it runs on a device.

    graphc::gemv(x, weight, bias, y!)     y = x @ weight^T (+ bias), x [1, K]

layers.Linear takes it where the plan says so (the gemv knob) and the step has one row.
"""
from __future__ import annotations

import torch


@torch.library.custom_op("graphc::gemv", mutates_args=("y",))
def gemv_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor) -> None:
    from models.components import gemv_triton as k

    k.gemv(x, weight, bias, y)


@gemv_op.register_fake
def _(x, weight, bias, y) -> None:
    return None


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [1, K] (elements contiguous) @ weight [N, K]^T (+ bias [N]) -> [1, N]."""
    m, k = x.shape
    n = weight.shape[0]
    if m != 1 or weight.shape[1] != k or not weight.is_contiguous() or x.stride(1) != 1:
        raise ValueError(f"gemv takes one row x [1, K] with contiguous elements and a contiguous weight [N, K]; got x "
                         f"{list(x.shape)} strides {list(x.stride())}, weight {list(weight.shape)}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"gemv: bias {list(bias.shape)} is not [{n}]")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    gemv_op(x, weight, bias, y)
    return y
