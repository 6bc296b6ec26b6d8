"""The one-row linear kernel (models/components/gemv_triton.py) on the GPU in bf16 at the real decode
shapes (the code predictor's, the talker's and the thinker's projections and heads, the talker's one-output
shared-expert gate; a ResizeMLP's with bias): against an fp64 product its error is cuBLAS's (both accumulate in fp32 and round once: the largest
error within 1.25x of cuBLAS's, the mean within 1.1x). Through layers.Linear with the plan's knob: one row
runs graphc.gemv, a CUDA graph of it replays to the eager result, and two rows stay on cuBLAS. Skipped
without CUDA."""
from __future__ import annotations

import pytest
import torch

from graphc.modules import set_kernels
from tests.unit.test_kernel_choice import OpNames

pytestmark = pytest.mark.gpu

SHAPES = {"cp.qkv": (4096, 1024), "cp.o": (1024, 2048), "cp.gate_up": (6144, 1024), "cp.down": (1024, 3072),
          "cp.lm_head": (2048, 1024), "talker.qkv": (2560, 1024), "talker.codec_head": (3072, 1024),
          "talker.shared_expert_gate": (1, 1024),
          "thinker.qkv": (5120, 2048), "thinker.o": (2048, 4096), "thinker.router": (128, 2048),
          "thinker.lm_head": (152064, 2048), "resize.fc1+bias": (2048, 2048)}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shape", list(SHAPES))
def test_gemv_error_is_cublas_error(shape):
    pytest.importorskip("triton")
    from models.components.gemv_ops import gemv

    n, k = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    bf = torch.bfloat16
    w = (torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).to(bf)
    x = torch.randn(3, k, device="cuda", generator=gen).to(bf)[1:2]
    b = torch.randn(n, device="cuda", generator=gen).to(bf) if "bias" in shape else None
    ref = x.double() @ w.double().t() + (0 if b is None else b.double())
    got = gemv(x, w, b)
    want = torch.nn.functional.linear(x, w, b)
    assert got.shape == want.shape == (1, n) and got.dtype == bf
    eg, ec = (got.double() - ref).abs(), (want.double() - ref).abs()
    assert eg.max() <= 1.25 * ec.max() + 1e-6, (shape, eg.max().item(), ec.max().item())
    assert eg.mean() <= 1.1 * ec.mean() + 1e-7, (shape, eg.mean().item(), ec.mean().item())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_linear_with_the_knob_runs_gemv_and_replays_in_a_graph():
    pytest.importorskip("triton")
    from models.components.layers import Linear

    lin = Linear(1024, 3072, bias=True).to("cuda", torch.bfloat16)
    set_kernels(lin, {"gemv": 1})
    x1 = torch.randn(1, 1, 1024, device="cuda", dtype=torch.bfloat16)
    x2 = torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16)
    names = OpNames()
    with names, torch.no_grad():
        eager = lin(x1)
    assert [s for s in names.seen if s.startswith("graphc.")] == ["graphc.gemv"]
    names.seen.clear()
    with names, torch.no_grad():
        lin(x2)
    assert not any(s.startswith("graphc.") for s in names.seen)
    static = x1.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        lin(static)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        out = lin(static)
    x3 = torch.randn_like(x1)
    static.copy_(x3)
    g.replay()
    with torch.no_grad():
        assert torch.equal(out, lin(x3))
    static.copy_(x1)
    g.replay()
    assert torch.equal(out, eager)


SWIGLU = {"cp.gate_up": (3072, 1024), "qwen3_5_9b.gate_up": (12288, 4096), "thinker.shared_expert": (768, 2048)}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shape", list(SWIGLU))
def test_fused_swiglu_product_error_is_the_two_launches_error(shape):
    """gemv_silu_mul at the one-row MLPs' shapes (I, K) against an fp64 silu(g) * u: its error within 1.25x (largest)
    and 1.1x (mean) of the gate_up gemv then silu_mul it replaces (the same roundings; only the sums' order within a
    program may differ)."""
    pytest.importorskip("triton")
    from models.components.gemv_ops import gemv, gemv_silu_mul
    from models.components.norm_ops import silu_mul

    i, k = SWIGLU[shape]
    gen = torch.Generator(device="cuda").manual_seed(i + k)
    w = (torch.randn(2 * i, k, device="cuda", generator=gen) * k ** -0.5).to(torch.bfloat16)
    x = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)
    p = x.double() @ w.double().t()
    ref = torch.nn.functional.silu(p[:, :i]) * p[:, i:]
    got, two = gemv_silu_mul(x, w), silu_mul(gemv(x, w, None))
    eg, et = (got.double() - ref).abs(), (two.double() - ref).abs()
    assert eg.max() <= 1.25 * et.max() + 1e-6, (shape, eg.max().item(), et.max().item())
    assert eg.mean() <= 1.1 * et.mean() + 1e-7, (shape, eg.mean().item(), et.mean().item())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [2, 5, 16, 33])
@pytest.mark.parametrize("shape", ["cp.qkv", "cp.down", "talker.codec_head", "thinker.o", "resize.fc1+bias"])
def test_few_rows_error_is_cublas_error(shape, rows):
    """gemm_rows (the few-rows kernel on the tensor cores) at the decode shapes and 2-33 rows: against an fp64
    product its error within 1.25x (largest) and 1.1x (mean) of cuBLAS's (both accumulate in fp32, round once)."""
    pytest.importorskip("triton")
    from models.components.gemv_triton import gemm_rows

    n, k = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(n + k + rows)
    bf = torch.bfloat16
    w = (torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).to(bf)
    x = torch.randn(rows, k + 8, device="cuda", generator=gen).to(bf)[:, 8:]
    b = torch.randn(n, device="cuda", generator=gen).to(bf) if "bias" in shape else None
    ref = x.double() @ w.double().t() + (0 if b is None else b.double())
    got = torch.empty(rows, n, device="cuda", dtype=bf)
    gemm_rows(x, w, b, got)
    want = torch.nn.functional.linear(x, w, b)
    eg, ec = (got.double() - ref).abs(), (want.double() - ref).abs()
    assert eg.max() <= 1.25 * ec.max() + 1e-6, (shape, rows, eg.max().item(), ec.max().item())
    assert eg.mean() <= 1.1 * ec.mean() + 1e-7, (shape, rows, eg.mean().item(), ec.mean().item())
