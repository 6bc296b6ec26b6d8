"""The norm_gemv knob on the GPU (gemv_triton.norm_gemv; norm_rows' norm_gemm_rows at 2-32 rows the same way): at
the code predictor's shapes (hidden 1,024; q/k/v 4,096 wide, gate_up
2 x 3,072) the fused launch against an fp64 forward errs as the two launches it replaces
(the norm's sum of squares may be taken in another order: within 1.25x of their largest error and 1.1x of
their mean), and the residual's sum is theirs bit for bit. Five code predictor layers (thinker.FoldedLayer)
captured with and without the knob replay to outputs within bf16 of each other over 20 inputs; both graphs'
replay times are printed (timing is examples/bench/ab_kernels.py --with norm_gemv's business). Skipped
without CUDA."""
from __future__ import annotations

import pytest
import torch

from graphc.modules import set_kernels

pytestmark = pytest.mark.gpu

KNOBS = {"fused_norms": 1, "gemv": 1, "gemv_swiglu": 2**30}


def _errs_as_the_two_launches(rows: int, swiglu: bool, seed: int, fused, unfused) -> None:
    """fused(x, r, nw, w, swiglu) -> (total, y) against add_rms_norm then unfused(h, w, swiglu), both against an fp64
    forward at the code predictor's shapes: y's error within 1.25x of the two launches' largest and 1.1x of their
    mean, total theirs bit for bit."""
    from models.components.norm_ops import add_rms_norm

    gen = torch.Generator(device="cuda").manual_seed(seed)
    bf, k = torch.bfloat16, 1024
    n = 6144 if swiglu else 4096
    w = (torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).to(bf)
    x, r = (torch.randn(rows, k, device="cuda", generator=gen).to(bf) for _ in range(2))
    nw = (1 + 0.1 * torch.randn(k, device="cuda", generator=gen)).to(bf)
    total, got = fused(x, r, nw, w, swiglu)
    t2, h = add_rms_norm(x, r, nw, 1e-6)
    two = unfused(h, w, swiglu)
    s = x.double() + r.double()
    p = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.double()) @ w.double().t()
    ref = torch.nn.functional.silu(p[:, :n // 2]) * p[:, n // 2:] if swiglu else p
    assert torch.equal(total, t2)
    eg, et = (got.double() - ref).abs(), (two.double() - ref).abs()
    assert eg.max() <= 1.25 * et.max() + 1e-6, (eg.max().item(), et.max().item())
    assert eg.mean() <= 1.1 * et.mean() + 1e-7, (eg.mean().item(), et.mean().item())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("swiglu", [False, True])
def test_norm_gemv_error_is_the_two_launches_error(swiglu):
    pytest.importorskip("triton")
    from models.components.gemv_ops import gemv, gemv_silu_mul, norm_gemv

    _errs_as_the_two_launches(1, swiglu, 7, lambda x, r, nw, w, sw: norm_gemv(x, r, nw, 1e-6, w, None, sw),
                              lambda h, w, sw: gemv_silu_mul(h, w) if sw else gemv(h, w, None))


def _captured(knob: int):
    from models.components.layers import SwiGLU
    from models.components.thinker import Attention, FoldedLayer
    from tests.gpu.test_pdl_gpu import graph_of, seeded

    torch.manual_seed(0)
    layers = seeded(torch.nn.ModuleList(FoldedLayer(1024, Attention(1024, 16, 8, 128, 1e-6), SwiGLU(1024, 3072), 1e-6)
                                        for _ in range(5)), 0.03)
    set_kernels(layers, KNOBS | {"norm_gemv": knob})
    x = torch.zeros(1, 1024, device="cuda", dtype=torch.bfloat16)
    cos = sin = torch.ones(1, 1, 128, device="cuda", dtype=torch.bfloat16)

    def run():
        h, d = x, None
        for layer in layers:
            h, d = layer(h, d, cos, sin, lambda q, k, v: q)
        return h + d

    graph, y = graph_of(run, layers, cos)
    return graph, x, y


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_layers_with_the_knob_equal_the_layers_without():
    pytest.importorskip("triton")
    from tests.gpu.test_pdl_gpu import _ms, both_replayed

    (plain, folded), want, got = both_replayed(_captured, 20)
    for a, b in zip(want, got):
        assert ((a.double() - b.double()).abs().max() / a.double().abs().max()).item() < 2e-2
    print(f"5 code predictor layers, one row: plain {_ms(plain) * 1000:.1f} us, norm_gemv {_ms(folded) * 1000:.1f} us")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [2, 16, 32])
@pytest.mark.parametrize("swiglu", [False, True])
def test_norm_gemm_rows_error_is_the_two_launches_error(swiglu, rows):
    """norm_gemm_rows (the norm_rows knob) at 2-32 rows against the add + norm launch then gemm_rows (and silu_mul)
    it replaces, as norm_gemv against its two (the sum of squares is taken in another order)."""
    pytest.importorskip("triton")
    from models.components.gemv_ops import gemm_rows, norm_gemm_rows
    from models.components.norm_ops import silu_mul

    _errs_as_the_two_launches(rows, swiglu, 11 + rows,
                              lambda x, r, nw, w, sw: norm_gemm_rows(x, r, nw, 1e-6, w, None, sw),
                              lambda h, w, sw: silu_mul(gemm_rows(h, w, None)) if sw else gemm_rows(h, w, None))
