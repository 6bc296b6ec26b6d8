"""The MoE experts on FlashInfer's SM90 grouped GEMMs (models/components/moe_sm90.py) at the thinker's and the
talker's real shapes: against an fp64 reference computed expert by expert from the same bf16 values, their error
is at or under the bf16 path's (Experts.forward's grouped_mm, equal to HF's block in tests/parity); with the
decoder layer's residual; through Experts.forward where the plan's knob chose them, after arrange_weights; and a
CUDA graph of them replays new routing to the eager result bit for bit (the kernels' deterministic mode). Skipped
without CUDA or without FlashInfer's CuTe-DSL kernels (nvidia-cutlass-dsl)."""
from __future__ import annotations

import pytest
import torch

from tests.gpu.test_moe_triton_gpu import SHAPES, reference

pytestmark = pytest.mark.gpu


def _experts(shape: str, seed: int):
    from models.components.moe import Experts

    e, h, i, k = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    mod = Experts(e, h, i).to("cuda", torch.bfloat16)
    with torch.no_grad():
        mod.gate_up_proj.normal_(0, 0.02, generator=gen)
        mod.down_proj.normal_(0, 0.02, generator=gen)
    return mod, gen


def _routing(tokens: int, e: int, k: int, gen, skew: float = 0.0):
    logits = torch.randn(tokens, e, generator=gen, device="cuda")
    logits[:, :8] += skew
    w, ex = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
    return ex, (w / w.sum(-1, keepdim=True)).to(torch.bfloat16)


@pytest.fixture(scope="module")
def sm90():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the SM90 kernels run on sm_90 only")
    from models.components import moe_sm90

    why = moe_sm90.available()
    if why:
        pytest.skip(f"FlashInfer's CuTe-DSL kernels cannot load: {why}")
    return moe_sm90


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("tokens,skew", [(65, 0.0), (300, 3.0), (2048, 0.0), (2048, 6.0)])
def test_sm90_experts_against_fp64_and_the_bf16_path(sm90, shape, tokens, skew):
    mod, gen = _experts(shape, tokens)
    e, h, i, k = SHAPES[shape]
    gu, dn = mod.gate_up_proj.detach().clone(), mod.down_proj.detach()
    x = torch.randn(tokens, h, generator=gen, device="cuda").to(torch.bfloat16)
    ex, w = _routing(tokens, e, k, gen, skew)
    res = torch.randn(tokens, h, generator=gen, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        ref = reference(x, gu, dn, ex, w)
        theirs = mod(x, ex, w)                                   # grouped_mm, gate then up
        mod.moe_sm90_from = 1
        mod.fused_max_tokens = 16384
        mod.arrange_weights()
        assert mod.gate_up_layout == sm90.INTERLEAVE
        ours = mod(x, ex, w)                                     # Experts.forward on the SM90 kernels
        ours_res = mod(x, ex, w, residual=res)
    scale = ref.abs().max().item()
    err_ours = (ours.double() - ref).abs().max().item() / scale
    err_theirs = (theirs.double() - ref).abs().max().item() / scale
    print(f"{shape} T={tokens} skew {skew}: sm90 {err_ours:.3e}, bf16 path {err_theirs:.3e} (of the largest output)")
    assert ours.dtype == torch.bfloat16 and ours.shape == (tokens, h)
    assert err_ours <= err_theirs, (err_ours, err_theirs)
    # the residual's add is rounded once after the rounded sum, as torch's add of the two
    torch.testing.assert_close(ours_res, (res.float() + ours.float()).to(torch.bfloat16), rtol=0, atol=0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_graph_of_the_sm90_experts_replays_new_routing(sm90, shape):
    from models.components.moe_ops import fused_experts

    mod, gen = _experts(shape, 7)
    e, h, i, k = SHAPES[shape]
    mod.moe_sm90_from = 1
    mod.arrange_weights()
    gu, dn = mod.gate_up_proj.detach(), mod.down_proj.detach()
    tokens = 1024
    x = torch.randn(tokens, h, generator=gen, device="cuda").to(torch.bfloat16)
    ex, w = _routing(tokens, e, k, gen)

    def run(x_, ex_, w_):
        return fused_experts(x_, gu, dn, ex_, w_, interleave=sm90.INTERLEAVE, sm90_from=1)

    static_x, static_ex, static_w = x.clone(), ex.clone(), w.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        run(static_x, static_ex, static_w)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        out = run(static_x, static_ex, static_w)
    new_ex, new_w = _routing(tokens, e, k, gen, skew=4.0)      # other routing: other tiles in use
    static_ex.copy_(new_ex)
    static_w.copy_(new_w)
    g.replay()
    with torch.no_grad():
        again = run(x, new_ex, new_w)
        twice = run(x, new_ex, new_w)
    torch.testing.assert_close(again, twice, rtol=0, atol=0)     # deterministic
    torch.testing.assert_close(out, again, rtol=0, atol=0)
