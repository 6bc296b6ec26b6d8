"""The MoE block's parameters as the checkpoint names them (models/components/moe.py's docstring and
reference/qwen3_omni.md): the fused experts, the router, and a shared expert exactly when one of
any width is declared. Its numbers against HF are in tests/parity."""
from __future__ import annotations

import pytest
import torch

from models.components.moe import SparseMoE


@pytest.mark.parametrize("shared", [0, 1, 6])
def test_parameters_by_hand(shared):
    h, i, e, k = 8, 4, 5, 2
    moe = SparseMoE(h, i, e, k, norm_topk_prob=True, shared_intermediate=shared)
    want = {"gate.weight": (e, h), "experts.gate_up_proj": (e, 2 * i, h), "experts.down_proj": (e, h, i)}
    if shared:
        # gate's rows then up's in one matrix (the checkpoint's gate_proj and up_proj, stacked at load)
        want |= {"shared_expert.gate_up_proj.weight": (2 * shared, h),
                 "shared_expert.down_proj.weight": (h, shared), "shared_expert_gate.weight": (1, h)}
    assert {n: tuple(p.shape) for n, p in moe.state_dict().items()} == want


def test_without_a_declared_shared_expert_there_is_none():
    assert not any(n.startswith("shared") for n in SparseMoE(8, 4, 5, 2, norm_topk_prob=False).state_dict())


def test_a_one_wide_shared_expert_adds_its_gated_output():
    torch.manual_seed(0)
    moe = SparseMoE(8, 4, 5, 2, norm_topk_prob=True, shared_intermediate=1)
    for p in moe.parameters():
        torch.nn.init.normal_(p)
    x = torch.randn(3, 8)
    routed = moe.experts(x, *moe.route(x))
    se = moe.shared_expert
    gate_w, up_w = se.gate_up_proj.weight[:1], se.gate_up_proj.weight[1:]
    # by hand: sigmoid(x . g) x down(silu(x . gate) * (x . up)), one intermediate unit
    extra = torch.sigmoid(x @ moe.shared_expert_gate.weight.T) * (
        torch.nn.functional.silu(x @ gate_w.T) * (x @ up_w.T)) @ se.down_proj.weight.T
    torch.testing.assert_close(moe(x), routed + extra)


@pytest.mark.parametrize("knob", [0, 1])
def test_a_shared_expert_with_the_residual_and_the_next_norm_by_hand(knob):
    """add_norm(x, residual, norm) of a block with a shared expert, with moe_shared_sum off and on (on a CPU the
    experts do not fuse, so the knob leaves the unfused launches): (residual + routed + gated shared, its norm),
    worked by hand as above. Experts.add_norm refuses a shared expert's rows where it cannot fuse them."""
    from graphc.modules import set_kernels
    from models.components.layers import RMSNorm

    torch.manual_seed(1)
    moe, norm = SparseMoE(8, 4, 5, 2, norm_topk_prob=True, shared_intermediate=3), RMSNorm(8)
    for p in (*moe.parameters(), norm.weight):
        torch.nn.init.normal_(p)
    set_kernels(moe, {"moe_shared_sum": knob})
    x, residual = torch.randn(3, 8), torch.randn(3, 8)
    se = moe.shared_expert
    gate_w, up_w = se.gate_up_proj.weight[:3], se.gate_up_proj.weight[3:]
    extra = torch.sigmoid(x @ moe.shared_expert_gate.weight.T) * (
        torch.nn.functional.silu(x @ gate_w.T) * (x @ up_w.T)) @ se.down_proj.weight.T
    total = residual + moe.experts(x, *moe.route(x)) + extra
    want = norm.weight * total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + norm.eps)
    y, h = moe.add_norm(x, residual, norm)
    torch.testing.assert_close(y, total)
    torch.testing.assert_close(h, want)
    with pytest.raises(ValueError, match="sums_norm"):
        moe.experts.add_norm(x, *moe.route(x), residual, norm, shared=(x, x[:, :1]))
