"""The fused norm kernels (models/components/norm_triton.py) on the GPU in bf16 at the real shapes: the
thinker's (hidden 2048; 32 query and 4 kv heads of 128) and the talker's (hidden 1024; 16 and 8 heads of
128), at 1, 16, 64 and 2048 rows. They round where the torch path rounds, so they equal it but for the
mean's summation order: the residual sum bit for bit, the rest within one bf16 ulp on a few elements;
and against an fp64 reference their error is at or under the torch path's. Through the modules: with the
plan's knob a layer runs the graphc operators on the GPU, and a CUDA graph of them replays to the eager
result. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from graphc.modules import set_kernels
from models.components.layers import RMSNorm, apply_rope
from tests.unit.test_kernel_choice import OpNames

pytestmark = pytest.mark.gpu

SHAPES = {"thinker": (2048, 32, 4, 128), "talker": (1024, 16, 8, 128)}


def ref_norm(x, w, eps):
    x = x.double()
    return w.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def ref_rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos.double() + torch.cat((-x[..., half:], x[..., :half]), -1) * sin.double()


def ulps(a, b, scale=None):
    """|a - b| in units of the bf16 spacing (2^(exponent - 7)) at |scale| (default: b)."""
    scale = b if scale is None else scale
    spacing = torch.exp2(torch.floor(torch.log2(scale.float().abs().clamp(min=2 ** -126))) - 7)
    return ((a.float() - b.float()).abs() / spacing)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("rows", [1, 16, 64, 2048])
def test_fused_norms_against_the_torch_path_and_fp64(shape, rows):
    pytest.importorskip("triton")
    from models.components import norm_ops

    hidden, heads, kv, d = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(rows)
    bf = torch.bfloat16
    norm = RMSNorm(hidden).to("cuda", bf)
    qn = RMSNorm(d).to("cuda", bf)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.2, generator=gen)
        qn.weight.normal_(1.0, 0.2, generator=gen)
    x = torch.randn(rows, hidden, device="cuda", generator=gen).to(bf)
    r = (4 * torch.randn(rows, hidden, device="cuda", generator=gen)).to(bf)
    proj = torch.randn(rows, (heads + kv) * d, device="cuda", generator=gen).to(bf)
    q = proj[:, :heads * d].view(rows, heads, d)
    ang = torch.rand(rows, 1, d // 2, device="cuda", generator=gen) * 100
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(bf), torch.cat([ang.sin()] * 2, -1).to(bf)
    eps = norm.eps
    with torch.no_grad():
        cases = {}
        cases["rms_norm"] = (norm_ops.rms_norm(x, norm.weight, eps), norm(x), ref_norm(x, norm.weight, eps))
        total, fused = norm_ops.add_rms_norm(x, r, norm.weight, eps)
        assert torch.equal(total, x + r)                         # the residual sum, rounded once as x + r is
        cases["add_rms_norm"] = (fused, norm(x + r), ref_norm(x + r, norm.weight, eps))
        n = qn(q)
        cases["qk_norm_rope"] = (norm_ops.qk_norm_rope(q, qn.weight, cos, sin, qn.eps), apply_rope(n, cos, sin),
                                 ref_rope(ref_norm(q, qn.weight, qn.eps), cos, sin))
        # the rotary sum's terms: a 1-ulp change in a normed element moves the sum by an ulp of the term
        # it enters, which is larger than the sum's own where the two terms cancel
        terms = (n.float() * cos.float()).abs() + (apply_rope(n, cos, sin).float() - n.float() * cos.float()).abs()
    for name, (got, torch_path, exact) in cases.items():
        assert got.shape == torch_path.shape and got.dtype == bf, name
        # a normed element one ulp apart (the mean's summation order moves rstd in its last bits) is at most
        # two ulps apart once the weight (about 1 +- 0.6) multiplies it and the product rounds
        off = ulps(got, torch_path, terms if name == "qk_norm_rope" else None)
        assert off.max() <= 2.0 and (off > 0).float().mean() <= 0.01, (name, off.max().item(), (off > 0).float().mean().item())
        err, err_torch = (got.double() - exact).abs().mean().item(), (torch_path.double() - exact).abs().mean().item()
        assert err <= err_torch * 1.001, (name, err, err_torch)


def test_a_thinker_layer_runs_the_operators_and_replays_in_a_graph():
    pytest.importorskip("triton")
    from models.components.thinker import MoETextConfig, moe_layer

    cfg = MoETextConfig(vocab_size=32, hidden_size=2048, num_hidden_layers=1, num_attention_heads=32,
                        num_key_value_heads=4, head_dim=128, moe_intermediate_size=768, num_experts=128,
                        num_experts_per_tok=8)
    torch.manual_seed(0)
    layer = moe_layer(cfg).to("cuda", torch.bfloat16)
    for p in layer.parameters():
        torch.nn.init.normal_(p, 0.0, 0.02) if p.dim() > 1 else torch.nn.init.normal_(p, 1.0, 0.1)
    T = 4
    x = torch.randn(T, 2048, device="cuda", dtype=torch.bfloat16)
    ang = torch.rand(T, 1, 64, device="cuda") * 50
    cos, sin = torch.cat([ang.cos()] * 2, -1).bfloat16(), torch.cat([ang.sin()] * 2, -1).bfloat16()

    def attend(q, k, v):                               # a stand-in for the paged attention: keeps the shapes
        return q * k.repeat_interleave(8, dim=1).mean() + v.repeat_interleave(8, dim=1)

    names = OpNames()
    seen = names.seen
    with torch.no_grad():
        set_kernels(layer, {})
        plain = layer(x, None, cos, sin, attend)[0]
        set_kernels(layer, {"fused_norms": 1, "fused_max_tokens": 64})
        with names:
            eager = layer(x, None, cos, sin, attend)[0]
        assert [s for s in seen if s in ("graphc.rms_norm", "graphc.q_k_norm_rope", "graphc.qk_norm_rope",
                                         "graphc.add_rms_norm", "graphc.moe_sum_add")] == [
            "graphc.rms_norm", "graphc.q_k_norm_rope", "graphc.add_rms_norm", "graphc.moe_sum_add"]
        rel = ((eager.float() - plain.float()).norm() / plain.float().norm()).item()
        assert rel <= 1e-2, rel                                  # the same layer, roundings apart
        static = x.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            layer(static, None, cos, sin, attend)[0]
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = layer(static, None, cos, sin, attend)[0]
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


@pytest.mark.parametrize("channels, samples", [(1536, 400), (768, 3200), (96, 192_000)])
def test_fused_snake_beta_against_fp64_and_the_torch_path(channels, samples):
    """Code2Wav's SnakeBeta at the decoder's real widths (16 slots of 100 frames: 1,536 channels at 400
    samples a slot up to 96 at 192,000), bf16 with trained-like alpha and beta: the fused kernel's error
    against fp64 is at or under the torch path's (nine bf16 ops), through the module with the plan's knob,
    on a strided input as the decoder's trimmed ConvTranspose output is, and replayed in a CUDA graph."""
    pytest.importorskip("triton")
    from models.components.code2wav import SnakeBeta

    gen = torch.Generator(device="cuda").manual_seed(channels)
    act = SnakeBeta(channels).to("cuda", torch.bfloat16)
    with torch.no_grad():
        act.alpha.normal_(0, 0.5, generator=gen)
        act.beta.normal_(0, 0.5, generator=gen)
        wide = torch.randn(16, channels, samples + 8, generator=gen, device="cuda").to(torch.bfloat16)
        x = wide[..., 4:samples + 4]                      # samples contiguous, channels strided
        a, b = act.alpha.double().exp()[None, :, None], act.beta.double().exp()[None, :, None]
        ref = x.double() + torch.sin(x.double() * a) ** 2 / (b + 1e-9)
        theirs = act(x)
        set_kernels(act, {"fused_norms": 1})
        ours = act(x)
        scale = ref.abs().max().item()
        err_ours = (ours.double() - ref).abs().max().item() / scale
        err_theirs = (theirs.double() - ref).abs().max().item() / scale
    print(f"snake C={channels} T={samples}: fused {err_ours:.2e}, torch {err_theirs:.2e}")
    assert ours.shape == x.shape and ours.dtype == torch.bfloat16 and ours.is_contiguous()
    assert err_ours <= err_theirs, (err_ours, err_theirs)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            act(x)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            out = act(x)
        g.replay()
    torch.testing.assert_close(out, ours, rtol=0, atol=0)


@pytest.mark.parametrize("seqs, slots", [(1, 2), (1, 1), (32, 2), (32, 1)])
def test_code_predictor_rotary_tables_broadcast(seqs, slots):
    """The code predictor's qk-norm + rotary: rows [S, n] (n = 2 at its first sub-step, then 1), one [n, 1, D]
    table row per slot shared by the S sequences (read in place at stride 0 where n = 1): equal to the torch
    path as the per-row case is, at the talker's code predictor heads (16 of 128)."""
    pytest.importorskip("triton")
    from models.components import norm_ops

    heads, d = 16, 128
    gen = torch.Generator(device="cuda").manual_seed(seqs * 10 + slots)
    bf = torch.bfloat16
    qn = RMSNorm(d).to("cuda", bf)
    with torch.no_grad():
        qn.weight.normal_(1.0, 0.2, generator=gen)
    proj = torch.randn(seqs, slots, (heads + 16) * d, device="cuda", generator=gen).to(bf)
    q = proj[..., :heads * d].view(seqs, slots, heads, d)              # strided rows, as split_qkv gives
    ang = torch.rand(slots, 1, d // 2, device="cuda", generator=gen) * 15
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(bf), torch.cat([ang.sin()] * 2, -1).to(bf)
    with torch.no_grad():
        n = qn(q)
        torch_path = apply_rope(n, cos, sin)
        got = norm_ops.qk_norm_rope(q, qn.weight, cos, sin, qn.eps)
        terms = (n.float() * cos.float()).abs() + (torch_path.float() - n.float() * cos.float()).abs()
    assert got.shape == (seqs, slots, heads, d)
    off = ulps(got, torch_path, terms)
    assert off.max() <= 2.0 and (off > 0).float().mean() <= 0.01, (off.max().item(), (off > 0).float().mean().item())


@pytest.mark.parametrize("hidden, inter", [(1024, 3072), (1024, 768), (1024, 2048)])
@pytest.mark.parametrize("rows", [1, 15, 512])
def test_fused_silu_mul_against_the_torch_path_and_fp64(hidden, inter, rows):
    """SwiGLU's activation at the code predictor's (3,072), the talker's shared expert's (768) and Code2Wav's
    transformer's widths: bit-equal to torch's silu and product but for silu's exp in its last bits (at most
    an ulp on 1% of elements), its error against fp64 at or under theirs, and the module with the knob
    replayed in a CUDA graph to its eager output."""
    pytest.importorskip("triton")
    from models.components.layers import SwiGLU
    from models.components.norm_ops import silu_mul

    gen = torch.Generator(device="cuda").manual_seed(rows + inter)
    gu = (2 * torch.randn(rows, 2 * inter, device="cuda", generator=gen)).to(torch.bfloat16)
    gate, up = gu[:, :inter], gu[:, inter:]
    with torch.no_grad():
        ours, theirs = silu_mul(gu), torch.nn.functional.silu(gate) * up
        g64 = gate.double()
        exact = g64 / (1 + torch.exp(-g64)) * up.double()
    off = ulps(ours, theirs)
    assert off.max() <= 1.0 and (off > 0).float().mean() <= 0.01, (off.max().item(), (off > 0).float().mean().item())
    assert (ours.double() - exact).abs().mean() <= (theirs.double() - exact).abs().mean() * 1.001
    mlp = SwiGLU(hidden, inter).to("cuda", torch.bfloat16)
    with torch.no_grad():
        for p in mlp.parameters():
            p.normal_(0.0, 0.02, generator=gen)
        x = torch.randn(rows, hidden, device="cuda", generator=gen).to(torch.bfloat16)
        plain = mlp(x)
        set_kernels(mlp, {"fused_norms": 1})
        eager = mlp(x)
        assert ulps(eager, plain, plain.abs().max()).max() <= 2.0
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            mlp(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = mlp(x)
        g.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("rows", [1, 64, 2048])
def test_q_and_k_in_one_launch_equal_two(shape, rows):
    """q_k_norm_rope (a layer's q and k heads in one grid, each with its norm weight) equals qk_norm_rope run
    on q and on k, bit for bit, on q and k as split_qkv gives them (strided views of one projection); given v,
    the same launch also copies it into the third output, in place in strided slots, touching nothing else."""
    pytest.importorskip("triton")
    from models.components import norm_ops
    from models.components.layers import split_qkv

    _, heads, kv, d = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(rows + 7)
    bf = torch.bfloat16
    wq = torch.randn(d, device="cuda", generator=gen).mul(0.2).add(1).to(bf)
    wk = torch.randn(d, device="cuda", generator=gen).mul(0.2).add(1).to(bf)
    qkv = torch.randn(rows, (heads + 2 * kv) * d, device="cuda", generator=gen).to(bf)
    q, k, v = split_qkv(qkv, heads, kv, d)
    ang = torch.rand(rows, 1, d // 2, device="cuda", generator=gen) * 100
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(bf), torch.cat([ang.sin()] * 2, -1).to(bf)
    yq, yk = norm_ops.q_k_norm_rope(q, k, wq, wk, cos, sin, 1e-6)
    assert torch.equal(yq, norm_ops.qk_norm_rope(q, wq, cos, sin, 1e-6))
    assert torch.equal(yk, norm_ops.qk_norm_rope(k, wk, cos, sin, 1e-6))
    # with v (the code predictor's frame cache: slot 1 of 3 of each row, left garbage around it)
    cq, ck, cv = (torch.full((rows, 3, h, d), float("nan"), device="cuda", dtype=bf) for h in (heads, kv, kv))
    norm_ops.q_k_norm_rope(q, k, wq, wk, cos, sin, 1e-6, (cq[:, 1], ck[:, 1], cv[:, 1]), v)
    assert torch.equal(cq[:, 1], yq) and torch.equal(ck[:, 1], yk) and torch.equal(cv[:, 1], v)
    assert cv[:, 0].isnan().all() and cv[:, 2].isnan().all()


@pytest.mark.parametrize("patches", [64, 1024, 8192])
def test_vision_fp32_rotary_equals_the_torch_path(patches):
    """q_k_rope_f32 (the vision encoder's q and k rotated in fp32 and rounded once; heads 72 wide, not a power of
    two) equals apply_rope(x.float(), cos, sin).to(bf16) bit for bit at the vision tower's real shape (16 heads,
    q and k strided views of one [P, 3, 16, 72] projection), eagerly and replayed in a CUDA graph; with v and a
    width of 128 (what the fa3 backend runs), the three are F.pad's copies of the same, zeros after 72 (the
    caching allocator hands back blocks that held other values, so unwritten pads would show)."""
    pytest.importorskip("triton")
    from models.components import norm_ops

    gen = torch.Generator(device="cuda").manual_seed(patches)
    qkv = (3 * torch.randn(patches, 3, 16, 72, device="cuda", generator=gen)).to(torch.bfloat16)
    q, k = qkv[:, 0], qkv[:, 1]
    ang = torch.rand(patches, 1, 36, device="cuda", generator=gen) * 64
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    want = (apply_rope(q.float(), cos, sin).to(torch.bfloat16), apply_rope(k.float(), cos, sin).to(torch.bfloat16))
    got = norm_ops.q_k_rope_f32(q, k, cos, sin)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    pads = [torch.nn.functional.pad(x, (0, 56)) for x in (*want, qkv[:, 2])]
    junk = torch.full((3 * patches * 16 * 128,), float("nan"), device="cuda", dtype=torch.bfloat16)
    del junk
    padded = norm_ops.q_k_rope_f32(q, k, cos, sin, v=qkv[:, 2], width=128)
    assert all(torch.equal(a, b) for a, b in zip(padded, pads))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        replayed = norm_ops.q_k_rope_f32(q, k, cos, sin)
        replayed_padded = norm_ops.q_k_rope_f32(q, k, cos, sin, v=qkv[:, 2], width=128)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed[0], want[0]) and torch.equal(replayed[1], want[1])
    assert all(torch.equal(a, b) for a, b in zip(replayed_padded, pads))
