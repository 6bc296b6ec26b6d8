"""The fused MoE kernels (models/components/moe_triton.py) on the GPU at the thinker's and the talker's real
shapes (128 experts; hidden 2048 / 1024, intermediate 768 / 384, top-8 / top-6) and several token
counts, held to an fp32 reference computed expert by expert from the same bf16 values: their error is
at or under the error of the bf16 path they replace (Experts.forward: grouped_mm, equal to HF's block
in tests/parity), and a CUDA graph of them replays to the eager result. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from models.components.moe import Experts

pytestmark = pytest.mark.gpu

SHAPES = {"thinker": (128, 2048, 768, 8), "talker": (128, 1024, 384, 6)}


def reference(x, gu, dn, ex, w) -> torch.Tensor:
    x, gu, dn, w = x.double(), gu.double(), dn.double(), w.double()
    out = torch.zeros_like(x)
    for e in ex.unique().tolist():
        tok, slot = (ex == e).nonzero(as_tuple=True)
        g, u = (x[tok] @ gu[e].T).chunk(2, dim=-1)
        out.index_add_(0, tok, (torch.nn.functional.silu(g) * u @ dn[e].T) * w[tok, slot][:, None])
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("tokens, pairs", [(1, 0), (7, 0), (64, 0), (100, 0), (300, 0), (2048, 0), (1, 1), (2, 2),
                                           (7, 7)])
def test_fused_experts_against_fp64_and_the_bf16_path(shape, tokens, pairs):
    """pairs: the steps of that many tokens run a program per pair (moe_pairs_triton.py)."""
    pytest.importorskip("triton")
    from functools import partial

    from models.components.moe_ops import fused_experts
    fused_experts = partial(fused_experts, pair_tokens=pairs)

    e, h, i, k = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    mod = Experts(e, h, i).to("cuda", torch.bfloat16)
    with torch.no_grad():
        mod.gate_up_proj.normal_(0, 0.02, generator=gen)
        mod.down_proj.normal_(0, 0.02, generator=gen)
    gu, dn = mod.gate_up_proj.detach(), mod.down_proj.detach()
    x = torch.randn(tokens, h, generator=gen, device="cuda").to(torch.bfloat16)
    probs = torch.softmax(torch.randn(tokens, e, generator=gen, device="cuda"), dim=-1)
    w, ex = torch.topk(probs, k, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(torch.bfloat16)
    with torch.no_grad():
        ref = reference(x, gu, dn, ex, w)
        scale = ref.abs().max().item()
        ours = fused_experts(x, gu, dn, ex, w)
        theirs = mod(x, ex, w)
    err_ours = (ours.double() - ref).abs().max().item() / scale
    err_theirs = (theirs.double() - ref).abs().max().item() / scale
    print(f"{shape} T={tokens} pairs {pairs}: fused {err_ours:.3e}, bf16 path {err_theirs:.3e} (of the largest output)")
    assert ours.dtype == torch.bfloat16 and ours.shape == (tokens, h)
    assert err_ours <= err_theirs, (err_ours, err_theirs)

    static_x, static_ex, static_w = x.clone(), ex.clone(), w.clone()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        fused_experts(static_x, gu, dn, static_ex, static_w)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g), torch.no_grad():
        out = fused_experts(static_x, gu, dn, static_ex, static_w)
    static_ex.copy_(torch.roll(ex, 1, dims=0))       # new routing, replayed
    g.replay()
    with torch.no_grad():
        again = fused_experts(x, gu, dn, static_ex, w)
    torch.testing.assert_close(out, again, rtol=0, atol=0)


def test_experts_forward_takes_the_fused_kernels_where_the_plan_chose_them():
    """Experts.forward with the plan's knob set runs the fused operators on the GPU (bit for bit their
    result) up to the chosen token count, and grouped_mm above it."""
    pytest.importorskip("triton")
    from graphc.modules import set_kernels
    from models.components.moe_ops import fused_experts

    e, h, i, k = SHAPES["talker"]
    gen = torch.Generator(device="cuda").manual_seed(1)
    mod = Experts(e, h, i).to("cuda", torch.bfloat16)
    with torch.no_grad():
        mod.gate_up_proj.normal_(0, 0.02, generator=gen)
        mod.down_proj.normal_(0, 0.02, generator=gen)
    x = torch.randn(8, h, generator=gen, device="cuda").to(torch.bfloat16)
    w, ex = torch.topk(torch.softmax(torch.randn(8, e, generator=gen, device="cuda"), dim=-1), k, dim=-1)
    w = w.to(torch.bfloat16)
    with torch.no_grad():
        fused = fused_experts(x, mod.gate_up_proj, mod.down_proj, ex, w)
        set_kernels(mod, {"fused_max_tokens": 8})
        assert torch.equal(mod(x, ex, w), fused)
        set_kernels(mod, {"fused_max_tokens": 7})
        assert not torch.equal(mod(x, ex, w), fused)          # grouped_mm rounds differently


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("tokens", [1, 64, 2048])
def test_fused_router_against_the_torch_path(shape, tokens):
    """The router's softmax, top-k and renormalisation in one launch (moe_ops.fused_route) against
    SparseMoE.route's torch ops on the same bf16 logits. bf16 logits tie often (8 bits of mantissa over 128
    experts), and torch.topk orders ties its own way where the kernel takes the lowest expert first: so each
    row's set of experts must be the same, except where the k-th and the (k+1)-th probabilities are within
    1e-6 of each other (a tie at the edge, which either choice is right for), and each expert's weight
    within one bf16 ulp."""
    pytest.importorskip("triton")
    from models.components.moe import SparseMoE
    from models.components.moe_ops import fused_route

    e, h, _, k = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    moe = SparseMoE(h, 8, e, k, True).to("cuda", torch.bfloat16)
    with torch.no_grad():
        moe.gate.weight.normal_(0, 0.02, generator=gen)
        x = torch.randn(tokens, h, device="cuda", generator=gen).to(torch.bfloat16)
        logits = moe.gate(x)
        want_e, want_w = moe.route(x)
        got_e, got_w = fused_route(logits, k, True)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32).sort(dim=-1, descending=True).values
    edge = (probs[:, k - 1] - probs[:, k]).abs() <= 1e-6 * probs[:, k - 1]
    ws, wi = want_e.sort(dim=-1)
    gs, gi = got_e.sort(dim=-1)
    same = (ws == gs).all(dim=-1)
    assert bool((same | edge).all()), (~(same | edge)).nonzero()[:5].tolist()
    assert bool((got_w.float().sum(-1) - 1).abs().max() <= 0.02)
    a, b = want_w.gather(1, wi).float(), got_w.gather(1, gi).float()           # each expert's weight
    ulp = torch.exp2(torch.floor(torch.log2(a.abs())) - 7)
    assert bool((((a - b).abs() <= ulp) | ~same[:, None]).all())


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("tokens", [1, 64, 2048])
def test_slots_sum_and_residual_add_round_as_torch(shape, tokens):
    """moe_sum_add (a decoder layer's residual + the k slots' sum, one launch) equals torch's
    residual + pairs.sum(1) in bf16: the slots summed in fp32 and rounded once, then the add rounded (at most
    an ulp apart on 1% of elements, where fp32's summation order tips a rounding)."""
    pytest.importorskip("triton")
    from models.components.moe_ops import moe_sum_add

    _, hidden, _, k = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    pairs = (0.3 * torch.randn(tokens, k, hidden, device="cuda", generator=gen)).to(torch.bfloat16)
    wide = (4 * torch.randn(tokens, 2 * hidden, device="cuda", generator=gen)).to(torch.bfloat16)
    residual = wide[:, 8:8 + hidden]                                  # rows strided
    y = torch.empty(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    moe_sum_add(pairs, residual, y)
    want = residual + pairs.sum(dim=1)
    apart = (y != want)
    spacing = torch.exp2(torch.floor(torch.log2(want.float().abs().clamp(min=2 ** -126))) - 7)
    assert ((y.float() - want.float()).abs() <= spacing).all()
    assert apart.float().mean() <= 0.01, apart.float().mean().item()
    assert (y.double() - (residual.double() + pairs.double().sum(1))).abs().mean() <= \
        (want.double() - (residual.double() + pairs.double().sum(1))).abs().mean() * 1.001


@pytest.mark.parametrize("tokens,k,experts", [(65, 8, 128), (2048, 8, 128), (1024, 6, 128), (16384, 8, 128)])
def test_the_counting_sort_groups_pairs_as_torch_stable_sort(tokens, k, experts):
    """moe_count + moe_place (steps of more than GROUP_SORT_FROM pairs) give torch's stable sort of the pairs'
    experts and their running counts, at the plans' prefill sizes (16,384 tokens: blocks of 1,024 pairs),
    routing skewed to 8 experts as seeded weights route; and replay in a CUDA graph to the same."""
    pytest.importorskip("triton")
    from models.components import moe_ops, moe_sort

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    logits = torch.randn(tokens, experts, device="cuda", generator=gen)
    logits[:, :8] += 3.0
    ex = torch.topk(logits, k, dim=-1).indices.reshape(-1).contiguous()
    p = ex.numel()
    _, nb = moe_sort.count_blocks(p)
    counts = torch.empty(nb, experts, device="cuda", dtype=torch.int32)
    rows = torch.empty(p, device="cuda", dtype=torch.int32)
    ends = torch.empty(experts, device="cuda", dtype=torch.int32)
    want_rows = torch.sort(ex, stable=True).indices.to(torch.int32)
    want_ends = torch.bincount(ex, minlength=experts).cumsum(0).to(torch.int32)
    moe_ops.moe_count(ex, counts)
    moe_ops.moe_place(ex, counts, rows, ends)
    assert torch.equal(rows, want_rows) and torch.equal(ends, want_ends)
    rows.zero_()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        moe_ops.moe_count(ex, counts)
        moe_ops.moe_place(ex, counts, rows, ends)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(rows, want_rows) and torch.equal(ends, want_ends)
