"""The MoE block's fused edges (models/components/moe_edges_triton.py) under Triton's interpreter on CPU:
route_group's experts and weights equal the torch router's (softmax in fp32, top k, renormalised; among equal
probabilities the lowest expert), and its rows and ends equal a stable sort of the pairs by expert worked in plain
Python; sum_add_norm's sum equals torch's bf16 sum and add, and its norm torch's RMSNorm of that sum (an ulp off
on a few elements at most: the mean's summation order). Then the experts through fused_route_group's grouping and
fused_experts_norm equal fused_experts' slots summed by torch, torch's add and its RMSNorm after it. On meta tensors, the thinker's decoder layers with
the two knobs run one operator for the router and grouping and one for the sum, the residual add and the next
layer's input norm (worked by hand). In a fresh process: TRITON_INTERPRET must be set before the kernels are
defined."""
import pytest
import torch

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

from tests.unit.test_kernel_choice import OpNames, graphc_ops  # noqa: E402
from tests.unit.test_moe_triton import interpreted  # noqa: E402

ROUTE = r"""
import torch
from models.components.moe_ops import fused_route_group

torch.manual_seed(0)
out = []
for T, E, K, norm in ((1, 12, 3, True), (3, 12, 3, False), (8, 128, 8, True), (5, 7, 7, True)):
    logits = torch.randn(T, E + 3)[:, 2:2 + E]                 # rows strided
    logits[0, 1] = logits[0, 4] = logits[0].max() + 1.0          # a tie: expert 1 first, then 4
    logits = logits.to(torch.bfloat16)
    experts, weights, (rows, ends) = fused_route_group(logits, K, norm)
    probs = torch.softmax(logits.float(), dim=-1)
    # the top K by probability, the lowest expert first among equal ones (bf16 logits tie often at E = 128)
    e_want = torch.tensor([sorted(range(E), key=lambda e: (-row[e], e))[:K] for row in probs.tolist()])
    w_want = probs.gather(1, e_want)
    if norm:
        w_want = w_want / w_want.sum(-1, keepdim=True)
    flat = experts.reshape(-1).tolist()
    order = sorted(range(len(flat)), key=lambda p: (flat[p], p))           # stable sort by expert
    ends_want = [sum(1 for e in flat if e <= x) for x in range(E)]
    out.append({"experts": experts.tolist(), "experts_want": e_want.tolist(),
                "w_err": (weights.float() - w_want.to(torch.bfloat16).float()).abs().max().item(),
                "rows": rows.tolist(), "rows_want": order, "ends": ends.tolist(), "ends_want": ends_want})
print(json.dumps(out))
"""


def test_route_group_routes_as_torch_and_groups_as_a_stable_sort():
    cases = interpreted(ROUTE)
    for r in cases:
        assert r["experts"] == r["experts_want"], r
        assert r["w_err"] <= 2 ** -8, r                       # an ulp at most (the interpreter's casts truncate)
        assert r["rows"] == r["rows_want"] and r["ends"] == r["ends_want"], r
    assert [c["experts"][0][:2] for c in cases] == [[1, 4]] * 4                  # the tie, lowest first


SUM_NORM = r"""
import torch
from models.components.moe_ops import moe_sum_add_norm

torch.manual_seed(0)
out = {}
for scaled in (False, True):
    T, K, H, eps = 5, 3, 1000, 1e-6
    pairs = (torch.randn(T, K, H) * 2).to(torch.bfloat16)
    residual = (torch.randn(T, H + 24) * 3).to(torch.bfloat16)[:, 8:8 + H]       # rows strided
    w = (1 + 0.3 * torch.randn(H)).to(torch.bfloat16)
    scale = torch.rand(T, K).to(torch.bfloat16)
    y = torch.empty(T, H, dtype=torch.bfloat16)
    h = torch.empty(T, H, dtype=torch.bfloat16)
    moe_sum_add_norm(pairs, residual, w, y, h, eps, scale.reshape(-1) if scaled else None)
    slots = pairs.float() * scale.float()[..., None] if scaled else pairs.float()
    y_want = residual + slots.sum(1).to(torch.bfloat16)                       # torch: sum rounded, then the add
    x32 = y_want.float()
    h_want = w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)
    out[str(scaled)] = {"y_equal": bool(torch.equal(y, y_want)),
                        "h_err": ((h.float() - h_want.float()).abs().max() / h_want.float().abs().max()).item(),
                        "h_differ": (h != h_want).float().mean().item()}
print(json.dumps(out))
"""


def test_sum_add_norm_sums_as_torch_and_norms_as_rms_norm():
    for case in interpreted(SUM_NORM).values():
        assert case["y_equal"], case
        assert case["h_err"] <= 2 ** -6 and case["h_differ"] <= 0.02, case


GATED = r"""
import torch
from models.components.moe_ops import moe_sum_add_norm

torch.manual_seed(1)
T, K, H, eps = 6, 2, 700, 1e-6
pairs = (torch.randn(T, K, H) * 2).to(torch.bfloat16)
residual = (torch.randn(T, H) * 3).to(torch.bfloat16)
shared = (torch.randn(T, H + 30) * 2).to(torch.bfloat16)[:, 10:10 + H]      # rows strided
gate = (torch.randn(T, 1) * 3).to(torch.bfloat16)
w = (1 + 0.3 * torch.randn(H)).to(torch.bfloat16)
y = torch.empty(T, H, dtype=torch.bfloat16)
h = torch.empty(T, H, dtype=torch.bfloat16)
moe_sum_add_norm(pairs, residual, w, y, h, eps, None, shared, gate)
# HF's order in bf16 torch ops: the slots' sum rounded, plus sigmoid(gate) * shared, then the residual, then the norm
out = pairs.float().sum(1).to(torch.bfloat16) + torch.sigmoid(gate) * shared
y_want = residual + out
x32 = y_want.float()
h_want = w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)
print(json.dumps({"y_equal": bool(torch.equal(y, y_want)),
                  "y_unshared": bool(torch.equal(y, residual + pairs.float().sum(1).to(torch.bfloat16))),
                  "h_err": ((h.float() - h_want.float()).abs().max() / h_want.float().abs().max()).item(),
                  "h_differ": (h != h_want).float().mean().item()}))
"""


def test_sum_add_norm_adds_a_gated_shared_expert_as_torch():
    """A shared expert's rows times sigmoid of its gate's logit, added to the slots' sum before the residual: the
    bf16 torch ops' roundings (SparseMoE's torch path), bit for bit in the sum, and the norm as above."""
    r = interpreted(GATED)
    assert r["y_equal"] and not r["y_unshared"], r
    assert r["h_err"] <= 2 ** -6 and r["h_differ"] <= 0.02, r


LAYER = r"""
import torch
from models.components.moe import Experts
from models.components.layers import RMSNorm
from models.components.moe_ops import fused_experts, fused_experts_norm, fused_route_group

torch.manual_seed(0)
E, H, I, T, K = 8, 80, 48, 4, 3
ex = Experts(E, H, I)
torch.nn.init.normal_(ex.gate_up_proj, std=0.2)
torch.nn.init.normal_(ex.down_proj, std=0.2)
ex = ex.to(torch.bfloat16)
norm = RMSNorm(H).to(torch.bfloat16)
torch.nn.init.normal_(norm.weight, 1.0, 0.2)
x = torch.randn(T, H).to(torch.bfloat16)
residual = torch.randn(T, H).to(torch.bfloat16)
logits = torch.randn(T, E).to(torch.bfloat16)
with torch.no_grad():
    experts, weights, grouped = fused_route_group(logits, K, True)
    y, h = fused_experts_norm(x, ex.gate_up_proj, ex.down_proj, experts, weights, residual, (norm.weight, norm.eps),
                              grouped=grouped)
    # the slots' sum by torch (rounded once), then torch's add and norm
    y_want = residual + fused_experts(x, ex.gate_up_proj, ex.down_proj, experts, weights)
    h_want = norm(y_want)
print(json.dumps({"y_equal": bool(torch.equal(y, y_want)), "h_differ": (h != h_want).float().mean().item(),
                  "h_err": ((h.float() - h_want.float()).abs().max() / h_want.float().abs().max()).item()}))
"""


def test_the_experts_through_the_fused_edges_equal_the_two_launches_each():
    r = interpreted(LAYER)
    assert r["y_equal"] and r["h_err"] <= 2 ** -6 and r["h_differ"] <= 0.02, r


def _stack(knobs: dict, T: int):
    """Three thinker layers (hidden 64, 8 experts, top 2) in bf16 on meta, run as the thinker runs them: the
    graphc operators they launch."""
    from models.components.thinker import MoETextConfig, moe_layer, next_norm

    cfg = MoETextConfig(vocab_size=32, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, num_experts=8,
                        num_experts_per_tok=2, mrope_section=(4, 2, 2))
    with torch.device("meta"):
        layers = torch.nn.ModuleList(moe_layer(cfg) for _ in range(3)).to(torch.bfloat16)
        x = torch.empty(T, 64, dtype=torch.bfloat16)
        cos = sin = torch.empty(T, 1, 16, dtype=torch.bfloat16)
    set_kernels = __import__("graphc.modules", fromlist=["set_kernels"]).set_kernels
    set_kernels(layers, knobs)

    def run():
        h, y = None, x
        for i, layer in enumerate(layers):
            y, h = layer(y, h, cos, sin, lambda q, k, v: torch.empty(T, 4, 16, device="meta", dtype=torch.bfloat16),
                         next_norm(layers, i))
        return y
    return graphc_ops(OpNames.of(run)[1])


BASE = {"fused_norms": 1, "fused_router": 1, "fused_max_tokens": 64, "gemv": 1}
LAYER_OPS = ["graphc.q_k_norm_rope", "graphc.add_rms_norm"]


def test_the_knobs_fold_the_router_grouping_and_the_next_norm_into_the_moe_launches():
    experts = ["graphc.moe_gate_up", "graphc.moe_down"]
    before = _stack(BASE, 1)
    one = ["graphc.gemv"] + LAYER_OPS[:1] + ["graphc.gemv"] + LAYER_OPS[1:] + ["graphc.gemv"]
    assert before == (["graphc.rms_norm"] + one + ["graphc.moe_route", "graphc.moe_group"] + experts
                      + ["graphc.moe_sum_add"]) * 3
    after = _stack(BASE | {"moe_route_group": 1, "moe_sum_norm": 1}, 1)
    # layer 0 norms its own input; layers 0 and 1 norm the next one's input in their last launch; layer 2 has none
    assert after == (["graphc.rms_norm"] + one + ["graphc.moe_route_group"] + experts + ["graphc.moe_sum_add_norm"]
                     + one + ["graphc.moe_route_group"] + experts + ["graphc.moe_sum_add_norm"]
                     + one + ["graphc.moe_route_group"] + experts + ["graphc.moe_sum_add"])
    assert len(after) == len(before) - 3 - 2                   # one launch fewer a layer, and two input norms


def test_route_group_only_for_the_pairs_one_program_holds():
    # 40 tokens x 2 = 80 pairs > 64: the router and the grouping stay two launches; the norm still rides along
    ops = _stack(BASE | {"moe_route_group": 1, "moe_sum_norm": 1}, 40)
    assert "graphc.moe_route_group" not in ops and ops.count("graphc.moe_route") == 3
    assert ops.count("graphc.moe_sum_add_norm") == 2 and ops.count("graphc.rms_norm") == 1


def test_route_group_up_to_its_pair_limit_and_below_the_sm90_steps():
    knobs = BASE | {"moe_route_group": 1, "moe_sum_norm": 1}
    assert _stack(knobs, 32).count("graphc.moe_route_group") == 3               # 32 x 2 = 64 pairs: the most it takes
    # a step the SM90 kernels run (from moe_sm90_from tokens) groups its pairs in their own launches
    assert "graphc.moe_route_group" not in _stack(knobs | {"moe_sm90_from": 32}, 32)
    assert _stack(knobs | {"moe_sm90_from": 33}, 32).count("graphc.moe_route_group") == 3


def test_a_shared_experts_gate_product_and_the_residual_ride_in_the_sum():
    """A MoE block with a gated shared expert (the talker's), one token, on meta: with moe_shared_sum (and
    moe_sum_norm) the gate's sigmoid, its product, the sum, the residual's add and the next norm are one
    moe_sum_add_norm (no aten sigmoid or mul, no add_rms_norm); without it, the sum then add_rms_norm (with
    moe_sum_norm too). A gate of the wrong shape is refused."""
    from graphc.modules import set_kernels
    from models.components.layers import RMSNorm
    from models.components.moe import SparseMoE
    from models.components.moe_ops import fused_experts_norm

    with torch.device("meta"):
        moe, norm = SparseMoE(64, 32, 8, 2, True, shared_intermediate=48).to(torch.bfloat16), RMSNorm(64)
        norm, x = norm.to(torch.bfloat16), torch.empty(1, 64, dtype=torch.bfloat16)
    knobs = BASE | {"moe_pair_tokens": 2, "gemv_swiglu": 2 ** 30, "moe_sum_norm": 1}
    seen = {}
    for sums in (0, 1):
        set_kernels(moe, knobs | {"moe_shared_sum": sums})
        set_kernels(norm, knobs)
        seen[sums] = [s for s in OpNames.of(lambda: moe.add_norm(x, torch.empty_like(x), norm))[1]
                      if s.startswith("graphc.") or s in ("aten.sigmoid", "aten.mul")]
    tail = ["graphc.moe_pair_gate_up", "graphc.moe_pair_down"]
    shared, router = ["graphc.gemv_silu_mul", "graphc.gemv"], ["graphc.gemv", "graphc.moe_route"]
    assert seen[1] == shared + ["graphc.gemv"] + router + tail + ["graphc.moe_sum_add_norm"], seen[1]
    assert seen[0] == (["graphc.gemv", "aten.sigmoid"] + shared + ["aten.mul"] + router + tail
                       + ["graphc.moe_sum_add", "graphc.add_rms_norm"]), seen[0]
    with torch.device("meta"):
        bad = (norm.weight, 1e-6, torch.empty(1, 64, dtype=torch.bfloat16), torch.empty(1, 2, dtype=torch.bfloat16))
        e = moe.experts
        with pytest.raises(ValueError, match=r"gate logits \(1, 2\).*want \[1, 64\].*and \[1, 1\]"):
            fused_experts_norm(x, e.gate_up_proj, e.down_proj, torch.zeros(1, 2, dtype=torch.long),
                               torch.empty(1, 2, dtype=torch.bfloat16), x, bad)
