"""The MoE block's fused edges (models/components/moe_edges_triton.py) on the GPU at the thinker's and the talker's
real shapes (128 experts, top 8 / top 6; hidden 2048 / 1024): with the moe_route_group and moe_sum_norm knobs a
SparseMoE's add_norm equals, bit for bit, the same block without them (the router, moe_group, moe_sum_add and the
next layer's RMSNorm as launches of their own) but for an ulp on a few elements of the norm (its mean's summation
order), from 1 token to the most route_group takes and past it; and a CUDA graph of it replays new inputs to the
eager result. With moe_shared_sum, the talker's block with its gated shared expert against the same without it.
Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from graphc.modules import set_kernels
from models.components.layers import RMSNorm
from models.components.moe import SparseMoE

pytestmark = pytest.mark.gpu

SHAPES = {"thinker": (128, 2048, 768, 8), "talker": (128, 1024, 384, 6)}
BASE = {"fused_norms": 1, "fused_router": 1, "fused_max_tokens": 16384, "gemv": 1}


def block(shape: str, seed: int) -> tuple[SparseMoE, RMSNorm]:
    e, h, i, k = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    moe = SparseMoE(h, i, e, k, True).to("cuda", torch.bfloat16)
    norm = RMSNorm(h).to("cuda", torch.bfloat16)
    with torch.no_grad():
        for p in (*moe.parameters(), norm.weight):
            p.normal_(0, 0.02, generator=gen)
        norm.weight.add_(1.0)
    return moe, norm


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("tokens", [1, 4, 8, 9, 64])
def test_the_fused_edges_equal_the_separate_launches(shape, tokens):
    pytest.importorskip("triton")
    moe, norm = block(shape, tokens)
    h = moe.gate.in_features
    gen = torch.Generator(device="cuda").manual_seed(100 + tokens)
    x = torch.randn(tokens, h, generator=gen, device="cuda").to(torch.bfloat16)
    residual = torch.randn(tokens, h, generator=gen, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        set_kernels(moe, BASE)
        set_kernels(norm, BASE)
        y_want, h_want = moe.add_norm(x, residual, norm)
        set_kernels(moe, BASE | {"moe_route_group": 1, "moe_sum_norm": 1})
        y, hn = moe.add_norm(x, residual, norm)
    assert torch.equal(y, y_want)
    differ = (hn != h_want).float().mean().item()
    err = ((hn.float() - h_want.float()).abs().max() / h_want.float().abs().max()).item()
    print(f"{shape} T={tokens}: norm elements differing {differ:.4f}, largest {err:.2e} of the largest")
    assert differ <= 0.02 and err <= 2 ** -7, (differ, err)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_graph_of_the_fused_edges_replays_new_inputs(shape):
    pytest.importorskip("triton")
    moe, norm = block(shape, 7)
    set_kernels(moe, BASE | {"moe_route_group": 1, "moe_sum_norm": 1})
    set_kernels(norm, BASE)
    h = moe.gate.in_features
    x = torch.randn(4, h, device="cuda").to(torch.bfloat16)
    res = torch.randn(4, h, device="cuda").to(torch.bfloat16)
    sx, sres = x.clone(), res.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        moe.add_norm(sx, sres, norm)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        y, hn = moe.add_norm(sx, sres, norm)
    sx.copy_(torch.randn(4, h, device="cuda").to(torch.bfloat16))      # new rows: new routing
    g.replay()
    with torch.no_grad():
        y_eager, h_eager = moe.add_norm(sx, sres, norm)
    assert torch.equal(y, y_eager) and torch.equal(hn, h_eager)


@pytest.mark.parametrize("tokens", [1, 2, 16])
def test_the_shared_experts_tail_in_the_sum_equals_its_launches(tokens):
    """The talker's block with its gated shared expert (intermediate 768): with moe_shared_sum the gate's sigmoid,
    the product and their add ride in moe_sum_add_norm; against the same block without it (torch's sigmoid and
    product, moe_sum_add, add_rms_norm) the sum is equal but where the two sigmoids round apart (at most 1% of
    elements, a bf16 ulp of the largest), the norm as above."""
    pytest.importorskip("triton")
    e, h, i, k = SHAPES["talker"]
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    moe = SparseMoE(h, i, e, k, True, shared_intermediate=768).to("cuda", torch.bfloat16)
    norm = RMSNorm(h).to("cuda", torch.bfloat16)
    with torch.no_grad():
        for p in (*moe.parameters(), norm.weight):
            p.normal_(0, 0.02, generator=gen)
        norm.weight.add_(1.0)
        x = torch.randn(tokens, h, generator=gen, device="cuda").to(torch.bfloat16)
        residual = torch.randn(tokens, h, generator=gen, device="cuda").to(torch.bfloat16)
        knobs = BASE | {"moe_route_group": 1, "moe_sum_norm": 1, "moe_pair_tokens": 2, "gemv_swiglu": 2 ** 24}
        set_kernels(norm, knobs)
        set_kernels(moe, knobs)
        y_want, h_want = moe.add_norm(x, residual, norm)
        set_kernels(moe, knobs | {"moe_shared_sum": 1})
        y, hn = moe.add_norm(x, residual, norm)
    ydiff = (y != y_want).float().mean().item()
    yerr = ((y.float() - y_want.float()).abs().max() / y_want.float().abs().max()).item()
    differ = (hn != h_want).float().mean().item()
    err = ((hn.float() - h_want.float()).abs().max() / h_want.float().abs().max()).item()
    print(f"shared T={tokens}: sum elements differing {ydiff:.4f} ({yerr:.2e}), norm {differ:.4f} ({err:.2e})")
    assert ydiff <= 0.01 and yerr <= 2 ** -7 and differ <= 0.02 and err <= 2 ** -7, (ydiff, yerr, differ, err)
