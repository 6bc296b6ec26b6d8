"""The frame_attend kernel (models/components/frame_triton.py) compiled on the GPU at the code predictor's shapes
(16 query and 8 key heads of 128, frames of 16 slots) in bf16, a whole frame's steps (2 rows at slot 0, then a
row a slot) at 1 and 16 sequences: against the two launches it replaces, q_k_norm_rope into the frame cache
(the same bits) and the ragged Triton attention over the frame (resources/ragged_triton.py, as the runtime
builds it), its output within one bf16 ulp of an fp32 attention over that cache and its error against fp64
that of the attention it replaces (x1.1); captured in a CUDA graph with pdl, a replay on new rows equals the
eager launch. Skipped without CUDA."""
from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

HQ, HK, D, G = 16, 8, 128, 16


def _frame_inputs(s: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = [(torch.rand(D, device="cuda", generator=gen) + 0.5).to(torch.bfloat16) for _ in range(2)]
    pos = torch.arange(G, device="cuda", dtype=torch.float64)[:, None] / \
        (1e6 ** (torch.arange(0, D, 2, device="cuda") / D))[None]
    c64, s64 = torch.cat((pos.cos(), pos.cos()), -1), torch.cat((pos.sin(), pos.sin()), -1)
    rows = [torch.randn(s, 2 if j == 0 else 1, (HQ + 2 * HK) * D, device="cuda", generator=gen).to(torch.bfloat16) * 3
            for j in range(G - 1)]
    return w, c64, s64, rows


def _split(qkv: torch.Tensor):
    s, n = qkv.shape[:2]
    q, k, v = qkv.split((HQ * D, HK * D, HK * D), -1)
    return q.view(s, n, HQ, D), k.view(s, n, HK, D), v.view(s, n, HK, D)


def _replaced(s: int, w, cos, sin, rows):
    """The two launches frame_attend replaces, over a whole frame: (cache, outputs)."""
    from models.components.norm_ops import q_k_norm_rope
    from resources.ragged_attention import RaggedAttentionSpec
    from resources.ragged_triton import RaggedTriton

    spec = RaggedAttentionSpec(name="code_predictor_attn", num_heads=HQ, num_kv_heads=HK, head_dim=D, max_segment=G,
                               causal=True, rows_per_segment=G, segment_axis="seqs")
    attn = RaggedTriton(spec, None, "cuda")
    cu = [i * G for i in range(s + 1)]
    attn.plan(cu, cu)
    cache = [torch.zeros(s, G, h, D, device="cuda", dtype=torch.bfloat16) for h in (HQ, HK, HK)]
    outs = []
    for j, qkv in enumerate(rows):
        sl = slice(0, 2) if j == 0 else slice(j + 1, j + 2)
        q, k, v = _split(qkv)
        q_k_norm_rope(q, k, w[0], w[1], cos[sl, None], sin[sl, None], 1e-6,
                      tuple(c[:, sl] for c in cache), v)
        o = attn(*(c.flatten(0, 1) for c in cache)).view(s, G, HQ, D)[:, sl]
        outs.append(o.clone())
    return cache, outs


def _fused(s: int, w, cos, sin, rows, pdl: bool = False):
    from models.components.frame_ops import frame_attend

    cache = [torch.zeros(s, G, h, D, device="cuda", dtype=torch.bfloat16) for h in (HQ, HK, HK)]
    outs = []
    for j, qkv in enumerate(rows):
        sl = slice(0, 2) if j == 0 else slice(j + 1, j + 2)
        outs.append(frame_attend(*_split(qkv), w[0], w[1], cos[sl, None], sin[sl, None], tuple(cache), sl.start,
                                 1e-6, pdl))
    return cache, outs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("s", [1, 16])
def test_a_frame_equals_the_launches_it_replaces(s):
    pytest.importorskip("triton")
    w, c64, s64, rows = _frame_inputs(s, s)
    cos, sin = c64.to(torch.bfloat16), s64.to(torch.bfloat16)
    cache, outs = _fused(s, w, cos, sin, rows)
    old_cache, old_outs = _replaced(s, w, cos, sin, rows)
    assert all(torch.equal(a, b) for a, b in zip(cache, old_cache))
    g = HQ // HK
    for j, (o, old) in enumerate(zip(outs, old_outs)):
        first, n = (0, 2) if j == 0 else (j + 1, 1)
        keys = first + n
        q, kc, vc = cache[0][:, first:keys].float(), cache[1][:, :keys].float(), cache[2][:, :keys].float()
        sc = torch.einsum("snhd,schd->snhc", q, kc.repeat_interleave(g, 2)) / math.sqrt(D)
        keep = torch.arange(keys, device="cuda")[None, :] <= torch.arange(first, keys, device="cuda")[:, None]
        sc = sc.masked_fill(~keep[None, :, None, :], float("-inf"))
        ref = torch.einsum("snhc,schd->snhd", sc.softmax(-1), vc.repeat_interleave(g, 2)).to(torch.bfloat16).float()
        # one bf16 ulp of the fp32 result, past fp32 summation's own error: where the weighted sum cancels to near
        # zero (a result of 4e-7 from values of order 1), the order of the additions moves it by more than an ulp
        ulp = 2.0 ** (torch.frexp(ref).exponent - 8).float()
        err = (o.float() - ref).abs() - 2.0 ** -16 * vc.abs().amax()
        assert (err <= ulp).all(), (j, (err / ulp).max().item())
        q64 = cache[0][:, first:keys].double()          # fp64 attention over the cache's (exact) bf16 rows
        s2 = torch.einsum("snhd,schd->snhc", q64, cache[1][:, :keys].double().repeat_interleave(g, 2)) / math.sqrt(D)
        s2 = s2.masked_fill(~keep[None, :, None, :], float("-inf"))
        want = torch.einsum("snhc,schd->snhd", s2.softmax(-1), cache[2][:, :keys].double().repeat_interleave(g, 2))
        err = ((o.double() - want).abs().mean() / want.abs().mean()).item()
        err_old = ((old.double() - want).abs().mean() / want.abs().mean()).item()
        assert err <= 1.1 * err_old + 1e-7, (j, err, err_old)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_captured_launch_with_pdl_replays_the_eager_one():
    pytest.importorskip("triton")
    from models.components.frame_ops import frame_attend

    s = 16
    w, c64, s64, rows = _frame_inputs(s, 7)
    cos, sin = c64.to(torch.bfloat16)[3:4, None], s64.to(torch.bfloat16)[3:4, None]
    cache = [torch.randn(s, G, h, D, device="cuda").to(torch.bfloat16) for h in (HQ, HK, HK)]
    inp = rows[2].clone()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):                     # warm-up (compiles) off the capture
        frame_attend(*_split(inp), w[0], w[1], cos, sin, tuple(c.clone() for c in cache), 3, 1e-6, True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = frame_attend(*_split(inp), w[0], w[1], cos, sin, tuple(cache), 3, 1e-6, True)
    inp.copy_(rows[5])
    graph.replay()
    torch.cuda.synchronize()
    eager_cache = [c.clone() for c in cache]
    want = frame_attend(*_split(rows[5]), w[0], w[1], cos, sin, tuple(eager_cache), 3, 1e-6, False)
    assert torch.equal(out, want)
    assert all(torch.equal(a, b) for a, b in zip(cache, eager_cache))
