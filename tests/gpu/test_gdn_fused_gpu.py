"""The gdn_fused knob on the GPU at Qwen3.5-9B's shapes (hidden 4096; Gated DeltaNet 16 key and 32 value heads of
128, conv kernel 4; full attention 16 query and 4 kv heads of 256), bf16, knob on against off:

- a Gated DeltaNet layer (the decode rule in place, gdn_slots, as the H200 plans run it): a decode step of 64
  sequences over 96 slots (slots out of order, every fifth sequence without a state, its slot holding garbage),
  then a step of a 40-row chunk beside two decode rows. Against the same layer in fp32 on the torch path, the
  knob's outputs and recurrent state are within the torch bf16 path's own error (25% margin); the conv state
  equals the torch path's bit for bit (the kernel only moves its values); the slots no sequence owns are left
  untouched. The same with gdn_conv_rows, which runs the mixed step's conv.
- the zero-centred norms: the hidden rows' (1 and 64 rows, and the residual add with it) and q_norm's and
  k_norm's over strided heads of one projection. The kernels round where the torch path rounds: the residual
  sum bit for bit, the rest within one bf16 ulp on at most 1% of the elements (the mean's summation order).
Prints the errors. Skipped without CUDA."""
from __future__ import annotations

import copy

import pytest
import torch

from graphc.modules import set_kernels
from models.components.gated_deltanet import GatedDeltaNet
from models.components.gated_deltanet_config import GatedDeltaNetConfig, state_spec
from models.components.qwen3_5_text import ZeroCentredRMSNorm
from resources.linear_state import StateStep, new_state
from tests.gpu.test_norm_triton_gpu import ulps

pytestmark = pytest.mark.gpu

CFG = GatedDeltaNetConfig(hidden_size=4096, linear_num_key_heads=16, linear_num_value_heads=32,
                          linear_key_head_dim=128, linear_value_head_dim=128)


def layer(dtype: torch.dtype, fused: bool, rows: bool = False) -> GatedDeltaNet:
    torch.manual_seed(0)
    m = GatedDeltaNet(CFG, 0)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * (0.02 if p.dim() > 1 else 0.1))
        m.A_log.copy_(torch.empty_like(m.A_log).uniform_(0.01, 0.3).log())
        m.norm.weight.normal_(1.0, 0.1)
        m.conv1d.weight.mul_(10)
    set_kernels(m, {"gdn_slots": 1, "gdn_fused": int(fused), "gdn_conv_rows": int(rows)})
    return m.to("cuda", dtype)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_a_gated_deltanet_layer_with_the_knob_holds_the_torch_paths_bf16_error():
    spec = state_spec(CFG, "s", 1)                                  # conv state bf16, recurrent fp32: the plans'
    torch.manual_seed(1)
    n, slots = 64, 96
    start = new_state(spec, slots, "cuda")
    start.conv.normal_(0, 0.5)
    start.recurrent.normal_(0, 0.05)
    order = torch.randperm(slots)[:n].tolist()
    has = [i % 5 != 0 for i in range(n)]
    x1, x2 = torch.randn(n, CFG.hidden_size, device="cuda"), torch.randn(42, CFG.hidden_size, device="cuda")
    results = {}
    for name, dtype, fused, rows in (("ref32", torch.float32, False, False), ("ref16", torch.bfloat16, False, False),
                                     ("fused16", torch.bfloat16, True, False), ("rows16", torch.bfloat16, True, True)):
        m, state = layer(dtype, fused, rows), copy.deepcopy(start)
        with torch.no_grad():
            y1 = m(x1.to(dtype), StateStep(state, order, [1] * n, has))
            conv1 = state.conv.clone()
            y2 = m(x2.to(dtype), StateStep(state, order[:3], [1, 40, 1], [True, True, True]))
        results[name] = (y1, y2, state.recurrent[0, order].clone(), conv1, state.conv.clone())
    ref = results["ref32"]
    errs = {name: [rel(results[name][i], ref[i]) for i in (0, 1, 2)] for name in ("ref16", "fused16", "rows16")}
    print(f"\nrelative error against fp32 (step 1 out, step 2 out, owned slots): torch bf16 {errs['ref16']}, "
          f"knob {errs['fused16']}, with gdn_conv_rows {errs['rows16']}")
    for name in ("fused16", "rows16"):
        for got, base in zip(errs[name], errs["ref16"]):
            assert got <= 1.25 * base + 1e-4, errs
        assert torch.equal(results[name][3], results["ref16"][3])   # the decode step's conv windows
        assert torch.equal(results[name][4], results["ref16"][4])   # the mixed step's (gdn_conv_rows in rows16)
    free = [i for i in range(slots) if i not in order]
    assert torch.equal(results["fused16"][3][0, free], start.conv[0, free])


@pytest.mark.parametrize("rows", [1, 64])
def test_the_zero_centred_norms_round_as_the_torch_path(rows):
    torch.manual_seed(rows)
    hidden, heads, kv, d = 4096, 16, 4, 256
    norms = {}
    for name, dim in (("hidden", hidden), ("q", d), ("k", d)):
        norms[name] = ZeroCentredRMSNorm(dim).to("cuda", torch.bfloat16)
        with torch.no_grad():
            norms[name].weight.normal_(0.0, 0.3)
    x = (2 * torch.randn(rows, hidden, device="cuda")).to(torch.bfloat16)
    r = torch.randn(rows, hidden, device="cuda").to(torch.bfloat16)
    proj = torch.randn(rows, (2 * heads + 2 * kv) * d, device="cuda").to(torch.bfloat16)   # GatedAttention's qkv
    q = proj[:, :2 * heads * d].view(rows, heads, 2 * d)[..., :d]
    k = proj[:, 2 * heads * d:(2 * heads + kv) * d].view(rows, kv, d)
    runs = {}
    for knob in (0, 1):
        for m in norms.values():
            set_kernels(m, {"gdn_fused": knob})
        with torch.no_grad():
            total, after = norms["hidden"].add(x, r)
            runs[knob] = [norms["hidden"](x), total, after, norms["q"](q), norms["k"](k)]
    assert torch.equal(runs[1][1], runs[0][1])                       # the residual sum
    for i, (got, want) in enumerate(zip(runs[1], runs[0])):
        off = ulps(got, want)
        print(f"\n{rows} rows, output {i}: max {off.max().item():.2f} ulp, {(off > 0).float().mean().item():.4%} differ")
        assert off.max().item() <= 1.0 and (off > 0).float().mean().item() <= 0.01, (i, off.max().item())


@pytest.mark.parametrize("rows", [1, 64])
def test_the_fused_q_k_norms_and_partial_rotary_round_as_the_torch_path(rows):
    """The gated_rope knob's one launch (norm_ops.zc_norm_partial_rope) for GatedAttention's q and k at the 9B's
    shapes (rotary on 64 of 256 dims, cos and sin of M-RoPE's layout in bf16): within one bf16 ulp (at each head's
    largest value: a rotary sum that cancels is small beside its terms) of q_norm, k_norm and apply_partial_rope on
    torch's path, on at most 1% of the elements; printed against the same with the norms fused (gdn_fused), whose
    arithmetic it repeats."""
    from models.components import norm_ops
    from models.components.qwen3_5_text import apply_partial_rope

    torch.manual_seed(rows)
    heads, kv, d, r = 16, 4, 256, 64
    qn, kn = (ZeroCentredRMSNorm(d).to("cuda", torch.bfloat16) for _ in range(2))
    with torch.no_grad():
        qn.weight.normal_(0.0, 0.3)
        kn.weight.normal_(0.0, 0.3)
    proj = (2 * torch.randn(rows, (2 * heads + 2 * kv) * d, device="cuda")).to(torch.bfloat16)
    q = proj[:, :2 * heads * d].view(rows, heads, 2 * d)[..., :d]
    k = proj[:, 2 * heads * d:(2 * heads + kv) * d].view(rows, kv, d)
    angle = torch.rand(rows, 1, r // 2, device="cuda") * 100
    cos, sin = (torch.cat((f(angle), f(angle)), -1).to(torch.bfloat16) for f in (torch.cos, torch.sin))
    with torch.no_grad():
        got = norm_ops.zc_norm_partial_rope(q, k, qn.weight, kn.weight, cos, sin, qn.eps)
        want = {}
        for knob in (0, 1):
            set_kernels(qn, {"gdn_fused": knob})
            set_kernels(kn, {"gdn_fused": knob})
            want[knob] = (apply_partial_rope(qn(q), cos, sin), apply_partial_rope(kn(k), cos, sin))
    for name, g, w0, w1 in zip("qk", got, want[0], want[1]):
        off = ulps(g, w0, w0.abs().amax(-1, keepdim=True).expand_as(w0))
        print(f"\n{rows} rows, {name}: max {off.max().item():.2f} ulp, {(off > 0).float().mean().item():.4%} differ "
              f"from torch's path; equal to the fused norms' path: {torch.equal(g, w1)}")
        assert off.max().item() <= 1.0 and (off > 0).float().mean().item() <= 0.01, (name, off.max().item())
