"""The one-row linear kernel (gemv_triton.py) as a torch operator, as norm_ops.py does for the norm kernels:
capture and the compiler's simulation see it as one launch whose output the caller allocates with
torch.empty. Triton is imported only when it runs on a device.

    graphc::gemv(x, weight, bias, y!)             y = x @ weight^T (+ bias), x [1, K]
    graphc::gemv_silu_mul(x, weight, y!)          y = silu(g) * u, [g | u] = x @ weight^T, weight [2I, K]
    graphc::norm_gemv(x, residual?, norm_weight, weight, bias?, total!?, y!, eps, swiglu)
                                                  either of them on h = rms_norm(x (+ residual)), total = the sum
    graphc::gemm_rows(x, weight, bias, y!)        y = x @ weight^T (+ bias), x [M, K], 1 <= M <= 64
    graphc::norm_gemm_rows(x, residual?, norm_weight, weight, bias?, total!?, y!, eps, swiglu)
                                                  gemm_rows (or a SwiGLU's product and activation) on h as above

layers.Linear takes gemv where the plan says so (the gemv knob) and the step has one row, gemm_rows where a step
has 2 to the gemm_rows knob's rows (norm_gemm_rows for a pre-normed input, the norm_rows knob); layers.SwiGLU
gemv_silu_mul (the gemv_swiglu knob); both take norm_gemv for a pre-normed input (their after_norm, the
norm_gemv knob).
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


@torch.library.custom_op("graphc::gemm_rows", mutates_args=("y",))
def gemm_rows_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor, pdl: bool = False
                 ) -> None:
    from models.components import gemv_triton as k

    k.gemm_rows(x, weight, bias, y, pdl=pdl)


@gemm_rows_op.register_fake
def _(x, weight, bias, y, pdl=False) -> None:
    return None


@torch.library.custom_op("graphc::norm_gemm_rows", mutates_args=("total", "y"))
def norm_gemm_rows_op(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                      weight: torch.Tensor, bias: torch.Tensor | None, total: torch.Tensor | None, y: torch.Tensor,
                      eps: float, swiglu: bool, pdl: bool = False) -> None:
    from models.components import gemv_triton as k

    k.norm_gemm_rows(x, residual, norm_weight, eps, weight, bias, total, y, swiglu, pdl)


@norm_gemm_rows_op.register_fake
def _(x, residual, norm_weight, weight, bias, total, y, eps, swiglu, pdl=False) -> None:
    return None


@torch.library.custom_op("graphc::gemv_silu_mul", mutates_args=("y",))
def gemv_silu_mul_op(x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, pdl: bool = False) -> None:
    from models.components import gemv_triton as k

    k.gemv_silu_mul(x, weight, y, pdl=pdl)


@gemv_silu_mul_op.register_fake
def _(x, weight, y, pdl=False) -> None:
    return None


@torch.library.custom_op("graphc::norm_gemv", mutates_args=("total", "y"))
def norm_gemv_op(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None, total: torch.Tensor | None, y: torch.Tensor, eps: float, swiglu: bool,
                 pdl: bool = False) -> None:
    from models.components import gemv_triton as k

    k.norm_gemv(x, residual, norm_weight, eps, weight, bias, total, y, swiglu, pdl)


@norm_gemv_op.register_fake
def _(x, residual, norm_weight, weight, bias, total, y, eps, swiglu, pdl=False) -> None:
    return None


def norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
              weight: torch.Tensor, bias: torch.Tensor | None, swiglu: bool = False, pdl: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(total, y): total = x + residual (x itself without one), h = rms_norm(total) * norm_weight, and y = gemv(h)
    ([1, N]), or with swiglu gemv_silu_mul(h) ([1, N / 2], no bias), in one launch; x [1, K], K <= 4,096."""
    _check(x, weight, "norm_gemv")
    k = x.shape[1]
    if k > 4096 or norm_weight.shape != (k,) or (residual is not None and residual.shape != x.shape):
        raise ValueError(f"norm_gemv: x {list(x.shape)}, residual {None if residual is None else list(residual.shape)}, "
                         f"norm weight {list(norm_weight.shape)}: one row of at most 4,096, the norm weight [K]")
    if swiglu and (weight.shape[0] % 2 or bias is not None):
        raise ValueError(f"norm_gemv: a SwiGLU's weight {list(weight.shape)} holds gate's rows then up's, no bias")
    total = None if residual is None else torch.empty_like(x)
    y = torch.empty(1, weight.shape[0] // (2 if swiglu else 1), dtype=x.dtype, device=x.device)
    norm_gemv_op(x, residual, norm_weight, weight, bias, total, y, eps, swiglu, pdl)
    return (x if total is None else total), y


def gemm_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pdl: bool = False) -> torch.Tensor:
    """x [M, K] (rows with contiguous elements), 1 <= M <= 64, @ weight [N, K]^T (+ bias [N]) -> [M, N] on the
    tensor cores, each weight row read once. pdl: as gemv_silu_mul's."""
    m, k = x.shape
    n = weight.shape[0]
    if not 1 <= m <= 64 or weight.shape[1] != k or not weight.is_contiguous() or x.stride(1) != 1:
        raise ValueError(f"gemm_rows takes x [M, K], 1 <= M <= 64, with contiguous elements and a contiguous weight "
                         f"[N, K]; got x {list(x.shape)} strides {list(x.stride())}, weight {list(weight.shape)}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"gemm_rows: bias {list(bias.shape)} is not [{n}]")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    gemm_rows_op(x, weight, bias, y, pdl)
    return y


def norm_gemm_rows(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                   weight: torch.Tensor, bias: torch.Tensor | None, swiglu: bool = False, pdl: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(total, y): total = x + residual (x itself without one), h = rms_norm(total) * norm_weight, and y =
    gemm_rows(h) ([M, N]), or with swiglu silu(g) * u ([M, N / 2], no bias), in one launch; x [M, K] with
    1 <= M <= 64 rows of contiguous elements."""
    m, k = x.shape
    if (not 1 <= m <= 64 or weight.shape[1] != k or not weight.is_contiguous() or x.stride(1) != 1
            or norm_weight.shape != (k,) or (residual is not None and (residual.shape != x.shape
                                                                         or residual.stride(1) != 1))):
        raise ValueError(f"norm_gemm_rows: x {list(x.shape)} strides {list(x.stride())}, residual "
                         f"{None if residual is None else list(residual.shape)}, norm weight {list(norm_weight.shape)},"
                         f" weight {list(weight.shape)}: 1 to 64 rows of K contiguous elements, the residual x's "
                         f"shape, the norm weight [K], a contiguous weight [N, K]")
    if swiglu and (weight.shape[0] % 2 or bias is not None):
        raise ValueError(f"norm_gemm_rows: a SwiGLU's weight {list(weight.shape)} holds gate's rows then up's, no bias")
    total = None if residual is None else torch.empty_like(x)
    y = torch.empty(m, weight.shape[0] // (2 if swiglu else 1), dtype=x.dtype, device=x.device)
    norm_gemm_rows_op(x, residual, norm_weight, weight, bias, total, y, eps, swiglu, pdl)
    return (x if total is None else total), y


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
