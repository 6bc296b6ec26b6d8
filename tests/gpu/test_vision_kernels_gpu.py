"""The vision tower's kernel choices on the GPU at its real shapes (hidden 1,152, 16 heads of 72, MLP 4,304,
8,192 patches), each against an fp64 reference and the torch path HF runs:

  - fused_norms: layers.LayerNorm as one Triton launch (norm_ops.layer_norm) and with the residual add
    before it (add_layer_norm): the sum bit for bit, the norm within an ulp of torch's, its error against
    fp64 at or under torch's;
  - fused_gelu: linear_fc1's bias and tanh GELU in cuBLASLt's epilogue (torch._addmm_activation): the
    tanh GELU (not the exact one, which the CPU's _addmm_activation computes) of the GEMM, rounded once, so
    its error against fp64 is under the torch path's (the GEMM rounded to bf16, then GELU rounded again);
  - a whole VisionBlock with the three knobs (fused_rope too) against the same block without them: its
    error against the block in fp64 at or under the torch path's, eagerly and replayed in a CUDA graph.

Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from graphc.modules import set_kernels
from tests.gpu.test_norm_triton_gpu import ulps
from tests.unit.test_kernel_choice import OpNames

pytestmark = pytest.mark.gpu

P, HIDDEN, HEADS, HEAD_DIM, MLP = 8192, 1152, 16, 72, 4304
KNOBS = {"fused_norms": 1, "fused_gelu": 1, "fused_rope": 1}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("rows", [64, P])
def test_layer_norm_against_torch_and_fp64(rows):
    pytest.importorskip("triton")
    from models.components import norm_ops
    from models.components.layers import LayerNorm

    gen = torch.Generator(device="cuda").manual_seed(rows)
    bf = torch.bfloat16
    norm = LayerNorm(HIDDEN, eps=1e-6).to("cuda", bf)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3, generator=gen)
        norm.bias.normal_(0.0, 0.5, generator=gen)
    x = (3 * torch.randn(rows, HIDDEN, device="cuda", generator=gen) + 0.7).to(bf)
    r = torch.randn(rows, HIDDEN, device="cuda", generator=gen).to(bf)

    def exact(t):
        return F.layer_norm(t.double(), (HIDDEN,), norm.weight.double(), norm.bias.double(), 1e-6)

    with torch.no_grad():
        total, fused_add = norm_ops.add_layer_norm(x, r, norm.weight, norm.bias, 1e-6)
        assert torch.equal(total, x + r)
        cases = {"layer_norm": (norm_ops.layer_norm(x, norm.weight, norm.bias, 1e-6), norm(x), exact(x)),
                 "add_layer_norm": (fused_add, norm(x + r), exact(x + r))}
    for name, (got, torch_path, ref) in cases.items():
        assert got.shape == (rows, HIDDEN) and got.dtype == bf, name
        # ulps of the terms' scale: where the weighted row and the bias nearly cancel, an fp32 ulp of either
        # term (torch contracts them into a fused multiply-add, this kernel need not) is many of the sum's
        bias = norm.bias.double()
        off = ulps(got, torch_path, (ref - bias).abs() + bias.abs())
        assert off.max() <= 1.0 and (off > 0).float().mean() <= 0.02, (name, off.max().item(),
                                                                         (off > 0).float().mean().item())
        err, err_torch = (got.double() - ref).abs().mean().item(), (torch_path.double() - ref).abs().mean().item()
        assert err <= err_torch * 1.001, (name, err, err_torch)


def test_gelu_epilogue_is_the_tanh_gelu_rounded_once():
    gen = torch.Generator(device="cuda").manual_seed(1)
    bf = torch.bfloat16
    x = torch.randn(P, HIDDEN, device="cuda", generator=gen).to(bf)
    w = (torch.randn(MLP, HIDDEN, device="cuda", generator=gen) / HIDDEN ** 0.5).to(bf)
    b = (0.5 * torch.randn(MLP, device="cuda", generator=gen)).to(bf)
    with torch.no_grad():
        fused = torch._addmm_activation(b, x, w.t(), use_gelu=True)
        torch_path = F.gelu(F.linear(x, w, b), approximate="tanh")
        lin = F.linear(x.double(), w.double(), b.double())
        tanh, erf = F.gelu(lin, approximate="tanh"), F.gelu(lin)
    assert fused.shape == (P, MLP) and fused.dtype == bf
    err, err_torch = rel(fused, tanh), rel(torch_path, tanh)
    assert err <= err_torch, (err, err_torch)
    # which GELU: in fp32, where rounding (about 1e-7) is far under the two GELUs' difference (about 1e-4)
    f32 = torch._addmm_activation(b.float(), x.float(), w.float().t(), use_gelu=True)
    assert rel(f32, tanh) * 10 < rel(f32, erf), (rel(f32, tanh), rel(f32, erf))


def test_a_vision_block_with_the_knobs_against_fp64_eager_and_replayed():
    pytest.importorskip("triton")
    pytest.importorskip("flashinfer")
    from models.components.vision import VisionBlock, VisionConfig
    from resources.base import StepShape
    from resources.flashinfer_backend import make_backend
    from resources.ragged_attention import RaggedAttentionSpec, RaggedTorch

    cfg = VisionConfig(depth=1, hidden_size=HIDDEN, num_heads=HEADS, intermediate_size=MLP, out_hidden_size=2048,
                       num_position_embeddings=2304, deepstack_visual_indexes=(0,))
    torch.manual_seed(0)
    block = VisionBlock(cfg).to("cuda")
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.normal_(1.0 if p.shape[0] == HIDDEN else 0.0, 0.1)
    ref_block = VisionBlock(cfg).to("cuda", torch.float64)
    ref_block.load_state_dict(block.state_dict())
    block = block.to(torch.bfloat16)
    cu = [0, 2048, P]                                         # two images' segments
    spec = RaggedAttentionSpec(name="vision_attn", num_heads=HEADS, head_dim=HEAD_DIM, max_segment=P)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    fa3 = make_backend(spec, "fa3", workspace, True, StepShape(rows=P, seqs=2, kv_len=P),   # a captured rung's,
                       run_head_dim=128)                                             # 72 run as 128
    fa3.plan(cu)
    x = torch.randn(P, HIDDEN, device="cuda").to(torch.bfloat16)
    delta = (0.5 * torch.randn(P, HIDDEN, device="cuda")).to(torch.bfloat16)
    pos = torch.rand(P, 1, HEAD_DIM // 2, device="cuda") * 64
    cos, sin = torch.cat([pos.cos()] * 2, -1), torch.cat([pos.sin()] * 2, -1)
    with torch.no_grad():
        ref = ref_block(x.double(), delta.double(), cos.double(), sin.double(), RaggedTorch(spec, cu))
        set_kernels(block, {})
        plain = block(x, delta, cos, sin, fa3)
        set_kernels(block, KNOBS)
        names = OpNames()
        with names:
            eager = block(x, delta, cos, sin, fa3)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            replayed = block(x, delta, cos, sin, fa3)
        g.replay()
        torch.cuda.synchronize()
    assert {"graphc.add_layer_norm", "graphc.q_k_rope_f32", "aten._addmm_activation"} <= set(names.seen)
    assert "aten.gelu" not in names.seen and "aten.native_layer_norm" not in names.seen
    for k in range(2):                                       # the block's x and its delta
        assert torch.equal(replayed[k], eager[k])
        err, err_torch = rel(eager[k], ref[k]), rel(plain[k], ref[k])
        assert err <= err_torch * 1.02, (k, err, err_torch)
