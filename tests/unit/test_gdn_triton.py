"""The in-place decode kernel of the gated delta rule (models/components/gdn_triton.py) under Triton's
interpreter on CPU equals the torch path it would replace (gated_deltanet.core's decode: read_slots,
prepare_qk, gated_delta_rule, index_copy_) within fp32 rounding: the outputs, the state written back in
each sequence's slot, and every other slot untouched. Slots out of order, sequences without a state (their
slot holds garbage that must read as zeros), key heads shared by two value heads, q and k strided views
of one projection, and head sizes that are not powers of two (the kernel masks). Then a GatedDeltaNet
layer's decode step through slot_core equals the same step through its torch core (what gdn_slots passes
the kernel). In a fresh process: TRITON_INTERPRET must be set before the kernel is defined."""
import pytest

pytest.importorskip("triton", reason="the kernel is Triton's; pip install -e '.[test]' brings it")

from tests.unit.test_moe_triton import interpreted  # noqa: E402

SCRIPT = r"""
import torch
from models.components.delta_rule import gated_delta_rule, prepare_qk, read_slots
from models.components.gdn_triton import slot_decode

torch.manual_seed(0)
out = {}
for dtype in (torch.float32, torch.bfloat16):
    N, HK, HV, DK, DV, S = 5, 2, 4, 24, 40, 9
    qkv = torch.randn(N, 2 * HK * DK + HV * DV).to(dtype)
    q = qkv[:, :HK * DK].view(N, HK, DK)
    k = qkv[:, HK * DK:2 * HK * DK].view(N, HK, DK)
    v = qkv[:, 2 * HK * DK:].view(N, HV, DV)
    g = -torch.rand(N, HV) * 2                        # log decay
    beta = torch.rand(N, HV).to(dtype)
    pool = torch.randn(S, HV, DK, DV)
    slots = torch.tensor([7, 2, 5, 0, 3])
    has = torch.tensor([True, False, True, True, False])
    want_pool = pool.clone()
    s0 = read_slots(want_pool, slots, has).float()
    qq, kk = prepare_qk(q, k, HV // HK)
    want_o, s1 = gated_delta_rule(qq, kk, v, g, beta, s0, list(range(N + 1)))
    want_pool.index_copy_(0, slots, s1)
    got_pool = pool.clone()
    got_o = slot_decode(q, k, v, g, beta, got_pool, slots, has)

    def rel(a, b):
        return ((a - b).abs().max() / b.abs().max()).item()
    untouched = [i for i in range(S) if i not in slots.tolist()]
    out[str(dtype)] = {"o": rel(got_o, want_o), "pool": rel(got_pool, want_pool),
                       "untouched_equal": bool(torch.equal(got_pool[untouched], pool[untouched])),
                       "new_sequence_moved": rel(got_pool[2], pool[2]) > 0.1}

# the layer's plumbing: GatedDeltaNet.slot_core in place of core, on a decode step of two sequences
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from models.components.gated_deltanet import GatedDeltaNet
from models.components.gated_deltanet_config import GatedDeltaNetConfig, state_spec
from resources.linear_state import StateStep, new_state

hf = Qwen3_5TextConfig(hidden_size=48, num_hidden_layers=1, layer_types=["linear_attention"],
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=24, linear_conv_kernel_dim=4, vocab_size=32, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=16)
cfg = GatedDeltaNetConfig.from_text_config(hf.to_dict())
layer = GatedDeltaNet(cfg, 0).eval()
for p in layer.parameters():
    torch.nn.init.normal_(p, 0.0, 0.3)
runs = {}
for name in ("torch", "slots"):
    torch.manual_seed(1)
    state = new_state(state_spec(cfg, "s", 1, conv_dtype="float32"), 5)
    state.recurrent.normal_()
    step = StateStep(state, [3, 1], [1, 1], [True, False])
    if name == "slots":
        layer.core = lambda q, k, v, g, beta, st: layer.slot_core(q, k, v, g, beta, st.recurrent(0), st)
    with torch.no_grad():
        runs[name] = (layer(torch.randn(2, 48), step), state.recurrent.clone())
out["layer"] = {"y": rel(runs["slots"][0], runs["torch"][0]), "pool": rel(runs["slots"][1], runs["torch"][1])}
print(json.dumps(out))
"""


def test_the_decode_kernel_equals_the_torch_rule_on_the_slots():
    out = interpreted(SCRIPT)
    layer = out.pop("layer")
    for dtype, r in out.items():
        assert r["o"] < 1e-5 and r["pool"] < 1e-5, (dtype, r)
        assert r["untouched_equal"] and r["new_sequence_moved"], (dtype, r)
    assert layer["y"] < 1e-5 and layer["pool"] < 1e-5, layer
