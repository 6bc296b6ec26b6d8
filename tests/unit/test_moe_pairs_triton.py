"""The per-pair MoE kernels (models/components/moe_pairs_triton.py) under Triton's interpreter on CPU equal
Experts.forward's batched fp32 path (itself equal to HF's MoE block: tests/parity): tokens that share an expert,
a step of one token, widths that are not multiples of the blocks, gate_up_proj's rows interleaved as the SM90
kernels read them, and the residual and the next norm in the last launch. On meta tensors, the knob swaps the
grouped launches for the pair launches at the steps it names, and only there."""
import pytest

from tests.unit.test_moe_edges_triton import BASE, _stack
from tests.unit.test_moe_triton import interpreted

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

SCRIPT = r"""
import torch
from models.components import moe_pairs_triton
from models.components.layers import RMSNorm
from models.components.moe import Experts
from models.components.moe_ops import fused_experts, fused_experts_norm
from models.components.moe_sm90 import interleave

# blocks of 32 columns and K steps of 32 over I = 48 and H = 80: a last partial block and step each way
moe_pairs_triton.BLOCKS = {"gate_up": {0: (32, 32, 2)}, "down": {0: (32, 32, 2)}}
torch.manual_seed(0)
E, H, I, K = 8, 80, 48, 3
ex = Experts(E, H, I)
torch.nn.init.normal_(ex.gate_up_proj, std=0.2)
torch.nn.init.normal_(ex.down_proj, std=0.2)
norm = RMSNorm(H)
torch.nn.init.normal_(norm.weight, 1.0, 0.2)
ilv = torch.stack([interleave(w, 8) for w in ex.gate_up_proj.detach()])      # up and gate rows 8 at a time
out = {}
with torch.no_grad():
    for name, experts in {"one": torch.tensor([[5, 1, 6]]),
                          "shared": torch.tensor([[2, 4, 7], [2, 0, 4], [3, 2, 1]])}.items():
        t = experts.shape[0]
        x, res = torch.randn(t, H), torch.randn(t, H)
        w = torch.rand(t, K)
        want = ex(x, experts, w)
        got = fused_experts(x, ex.gate_up_proj, ex.down_proj, experts, w, pair_tokens=t)
        got_ilv = fused_experts(x, ilv, ex.down_proj, experts, w, interleave=8, pair_tokens=t)
        y, h = fused_experts_norm(x, ex.gate_up_proj, ex.down_proj, experts, w, res, (norm.weight, norm.eps),
                                  pair_tokens=t)
        err = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()
        out[name] = {"err": err(got, want), "ilv_err": err(got_ilv, want), "y_err": err(y, want + res),
                     "h_err": err(h, norm(want + res))}
print(json.dumps(out))
"""


def test_the_pair_kernels_equal_the_reference_path_in_the_interpreter():
    r = interpreted(SCRIPT)
    assert set(r) == {"one", "shared"}
    for case in r.values():
        assert max(case.values()) <= 1e-5, r


def test_the_knob_runs_the_pair_launches_at_its_steps_and_groups_above():
    experts = ["graphc.moe_gate_up", "graphc.moe_down"]
    pairs = ["graphc.moe_pair_gate_up", "graphc.moe_pair_down"]
    knobs = BASE | {"moe_route_group": 1, "moe_sum_norm": 1, "moe_pair_tokens": 2}
    one = ["graphc.gemv", "graphc.q_k_norm_rope", "graphc.gemv", "graphc.add_rms_norm", "graphc.gemv"]
    # at one and two tokens: the router alone (no grouping), the pairs' two products, the sum with the next norm
    assert _stack(knobs, 1) == (["graphc.rms_norm"] + (one + ["graphc.moe_route"] + pairs + ["graphc.moe_sum_add_norm"])
                                * 2 + one + ["graphc.moe_route"] + pairs + ["graphc.moe_sum_add"])
    moe = (["graphc.moe_route"] + pairs + ["graphc.moe_sum_add_norm"]) * 2 + ["graphc.moe_route"] + pairs + [
        "graphc.moe_sum_add"]
    assert [op for op in _stack(knobs, 2) if "moe" in op] == moe      # two tokens: the same MoE launches
    # at three: the grouped kernels, the router grouping the pairs
    three = _stack(knobs, 3)
    assert three.count("graphc.moe_route_group") == 3 and three.count(experts[0]) == 3 and pairs[0] not in three
