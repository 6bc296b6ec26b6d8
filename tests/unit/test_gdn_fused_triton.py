"""The gdn_fused knob's kernels (norm_triton.py: zc_rms_norm, add_zc_rms_norm, gated_rms_norm; gdn_step_triton.py:
gates, conv_row) under Triton's interpreter on CPU against the torch paths they replace (qwen3_5_text.
ZeroCentredRMSNorm, GatedRMSNorm, GatedDeltaNet's gates and its conv: read_slots, causal_conv's one-row branch,
index_copy_), then whole layers with the knob on and off, then the launches the knob saves in the compiler's
simulation of a decode step, counted by hand.

Tolerances: in bf16 the norms, beta and the conv's output are equal bit for bit (the kernels round where torch
rounds, with norm_triton._round; the mean's and the taps' summation orders differ, which moves a bf16 result
only where its fp32 value lies within an fp32 ulp of a rounding boundary: none in these rows); the conv state
written back is equal bit for bit in every dtype (it only moves values). In fp32 each is within a few fp32
ulps of the torch path (summation order; exp, log and division to the last bit), as is g, the fp32 log decay,
in both dtypes. In a fresh process: TRITON_INTERPRET must be set before the kernels are defined."""
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

from tests.unit.test_moe_triton import interpreted  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

KERNELS = r"""
import torch
import torch.nn.functional as F
from models.components import norm_ops
from models.components.delta_rule import causal_conv, read_slots
from models.components.gated_deltanet import GatedRMSNorm
from models.components.qwen3_5_text import ZeroCentredRMSNorm

def cmp(got, want):
    d = (got.float() - want.float()).abs()
    return {"err": d.max().item(), "scale": want.float().abs().max().item(), "equal": bool(torch.equal(got, want)),
            "dtype": str(got.dtype), "shape": list(got.shape)}

torch.manual_seed(0)
out = {}
for dt in (torch.float32, torch.bfloat16):
    res = {}
    with torch.no_grad():
        norm = ZeroCentredRMSNorm(96).to(dt)                      # 96: not a power of two (the kernel masks)
        torch.nn.init.normal_(norm.weight, 0.0, 0.3)
        x = (2 * torch.randn(5, 200)).to(dt)[:, 3:99]              # rows strided: a slice of a wider tensor
        res["zc"] = cmp(norm_ops.zc_rms_norm(x, norm.weight, norm.eps), norm(x))
        heads = ZeroCentredRMSNorm(24).to(dt)                      # q_norm's layout: [T, H, D] heads of a projection
        torch.nn.init.normal_(heads.weight, 0.0, 0.3)
        q = torch.randn(5, 6, 40).to(dt)[:, :, 4:28]               # rows and heads strided
        res["zc_heads"] = cmp(norm_ops.zc_rms_norm(q, heads.weight, heads.eps), heads(q))
        r = torch.randn(5, 96).to(dt)
        (wt, wn), (gt, gn) = (x + r, norm(x + r)), norm_ops.add_zc_rms_norm(x, r, norm.weight, norm.eps)
        res["add_total"], res["add_norm"] = cmp(gt, wt), cmp(gn, wn)
        gated = GatedRMSNorm(20).to(dt)                            # the core's fp32 rows, the gate in the layer's dtype
        torch.nn.init.normal_(gated.weight, 1.0, 0.3)
        o, z = torch.randn(5, 3, 20), (2 * torch.randn(5, 3, 20)).to(dt)
        res["gated"] = cmp(norm_ops.gated_rms_norm(o, z, gated.weight, gated.eps), gated(o.to(dt), z))
        zs = (2 * torch.randn(5, 77)).to(dt)[:, 9:69].view(5, 3, 20)   # z as the stacked projection's column view
        res["gated_strided"] = cmp(norm_ops.gated_rms_norm(o, zs, gated.weight, gated.eps), gated(o.to(dt), zs))
        # gates: a + dt_bias past softplus's threshold (20), far below it, and where log1p matters (-12)
        a_log, dt_bias = torch.randn(12).to(dt), torch.randn(12).to(dt)
        b = (3 * torch.randn(7, 20)).to(dt)[:, 2:14]
        a = (4 * torch.randn(7, 12)).to(dt)
        a[0, :3] = torch.tensor([25.0, -30.0, -12.0]).to(dt) - dt_bias[:3]
        beta, g = norm_ops.gdn_gates(b, a, a_log, dt_bias)
        want_g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())
        res["beta"] = cmp(beta, b.sigmoid())
        res["g_rel"] = ((g - want_g).abs() / want_g.abs()).max().item()
        res["g_dtype"] = str(g.dtype)
        # the one-row conv on the pool: 300 channels (a full 256-channel block and a part one), K 4 and 3, slots out
        # of order, two sequences without a state whose slots hold garbage, slots 2, 4 and 6 untouched
        for k in (4, 3):
            for pool_dt in (torch.float32, torch.bfloat16):
                n, c, s = 4, 300, 7
                xr = (2 * torch.randn(n, c + 10)).to(dt)[:, 5:5 + c]
                w = torch.randn(c, 1, k).to(dt)[:, 0]              # conv1d.weight[:, 0]
                pool = (3 * torch.randn(s, c, k - 1)).to(pool_dt)
                slots, has = torch.tensor([5, 1, 3, 0]), torch.tensor([True, False, True, False])
                want_pool = pool.clone()
                want_y, new = causal_conv(xr, w, read_slots(want_pool, slots, has), list(range(n + 1)))
                want_pool.index_copy_(0, slots, new.to(pool_dt))
                got_pool = pool.clone()
                got_y = norm_ops.gdn_conv_row(xr, w, got_pool, slots, has)
                tag = f"conv_k{k}_{str(pool_dt)[6:]}"
                res[tag] = cmp(got_y, want_y)
                res[tag]["pool_equal"] = bool(torch.equal(got_pool, want_pool))
                res[tag]["untouched"] = bool(torch.equal(got_pool[[2, 4, 6]], pool[[2, 4, 6]]))
                # any step's conv: sequences of 1, 2 (under K-1 rows: its new window keeps old rows), 5 and 3 rows,
                # two without a state whose slots hold garbage
                lens = [1, 2, 5, 3]
                cu = [0, 1, 3, 8, 11]
                xs = (2 * torch.randn(cu[-1], c + 6)).to(dt)[:, 3:3 + c]
                want_pool = pool.clone()
                want_y, new = causal_conv(xs, w, read_slots(want_pool, slots, has), cu)
                want_pool.index_copy_(0, slots, new.to(pool_dt))
                got_pool = pool.clone()
                seq = torch.repeat_interleave(torch.arange(4, dtype=torch.int32), torch.tensor(lens))
                got_y = norm_ops.gdn_conv_rows(xs, w, got_pool, slots, has, seq, torch.tensor(cu, dtype=torch.int32))
                tag = f"rows_k{k}_{str(pool_dt)[6:]}"
                res[tag] = cmp(got_y, want_y)
                res[tag]["pool_equal"] = bool(torch.equal(got_pool, want_pool))
                res[tag]["untouched"] = bool(torch.equal(got_pool[[2, 4, 6]], pool[[2, 4, 6]]))
    out[str(dt)] = res
print(json.dumps(out))
"""


def test_kernels_equal_the_torch_paths_in_the_interpreter():
    out = interpreted(KERNELS)
    f32, bf16 = out["torch.float32"], out["torch.bfloat16"]
    norms = ("zc", "zc_heads", "add_total", "add_norm", "gated", "gated_strided")
    convs = [f"{kind}_k{k}_{p}" for kind in ("conv", "rows") for k in (4, 3) for p in ("float32", "bfloat16")]
    assert [f32[k]["shape"] for k in ("zc", "zc_heads", "add_norm", "gated")] == [[5, 96], [5, 6, 24], [5, 96],
                                                                                   [5, 3, 20]]
    for k in norms + ("beta",) + tuple(convs):
        assert f32[k]["err"] <= 2e-6 * f32[k]["scale"], (k, f32[k])
        assert bf16[k]["equal"] and bf16[k]["dtype"] == "torch.bfloat16", (k, bf16[k])
    assert bf16["gated"]["shape"] == [5, 3, 20]                 # the gate's dtype, from fp32 rows
    for r in (f32, bf16):
        assert r["g_rel"] <= 1e-6 and r["g_dtype"] == "torch.float32", r
        for k in convs:
            assert r[k]["pool_equal"] and r[k]["untouched"], (k, r[k])


# a script's attention stand-in (q, k and v all reach the output; one kv head) and the operators a block ran
WATCH = r"""
from torch.utils._python_dispatch import TorchDispatchMode


def attend(layer, q, k, v):
    return q * (k * v).sum(-1, keepdim=True)


class Seen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket._qualified_op_name))
        return func(*args, **(kwargs or {}))


"""

LAYERS = r"""
import torch
from graphc import StepContext
from graphc.modules import set_kernels
from models.components import norm_ops
from models.components.qwen3_5_text import Qwen3_5DecoderLayer
from models.components.qwen3_5_text_config import Qwen3_5TextConfig
from resources.linear_state import StateStep, new_state

norm_ops.KERNEL_DEVICES = ("cuda", "meta", "cpu")              # the interpreter runs the kernels on the CPU
cfg = Qwen3_5TextConfig(vocab_size=32, hidden_size=48, intermediate_size=40, num_hidden_layers=2,
                        num_attention_heads=3, num_key_value_heads=1, head_dim=24, linear_num_key_heads=2,
                        linear_num_value_heads=4, linear_key_head_dim=12, linear_value_head_dim=20,
                        layer_types=("linear_attention", "full_attention"), mrope_section=(2, 1, 0))
torch.manual_seed(0)
layers = [Qwen3_5DecoderLayer(cfg, i) for i in range(2)]
for m in layers:
    for p in m.parameters():
        torch.nn.init.normal_(p, 0.0, 0.3)
    m.to(torch.bfloat16).eval()
start = new_state(cfg.state_spec("s"), 6)
start.conv.normal_(0, 2)                 # garbage in the slots of the sequences without a state
start.recurrent.normal_(0, 0.3)
xs = [(2 * torch.randn(t, 48)).to(torch.bfloat16) for t in (3, 4)]
cos, sin = torch.randn(3, 1, 6).to(torch.bfloat16), torch.randn(3, 1, 6).to(torch.bfloat16)

""" + WATCH + r"""
runs = {}
for knob in (0, 1):
    for m in layers:
        set_kernels(m, {"gdn_fused": knob, "gdn_conv_rows": knob})
    state = new_state(cfg.state_spec("s"), 6)
    state.conv.copy_(start.conv)
    state.recurrent.copy_(start.recurrent)
    seen = Seen()
    with torch.no_grad(), seen:
        # a decode step of 3 sequences (slots out of order, the second without a state), then a step of a 3-row
        # chunk continuing slot 4 and a decode row (the gates fused; the conv gdn_conv_rows: not one row each)
        y1 = layers[0](xs[0], cos, sin, StepContext({"state": StateStep(state, [4, 0, 2], [1, 1, 1],
                                                                          [True, False, True])}))
        y2 = layers[0](xs[1], cos, sin, StepContext({"state": StateStep(state, [4, 2], [3, 1], [True, True])}))
        y3 = layers[1](xs[0], cos, sin, StepContext({"kv": attend}))
        y4 = layers[1].input_layernorm(xs[1])                  # the final norm's case: a [S, D] row
        y5 = layers[1](xs[0], cos, sin, StepContext({"kv": attend}), delta=xs[0].flip(0))   # the add before its norm
    # each layer gives (the residual stream, its MLP's output not yet added)
    runs[knob] = dict(y=[*y1, *y2, *y3, y4, *y5], conv=state.conv.clone(), rec=state.recurrent.clone(), ops=seen.ops)


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


off, on = runs[0], runs[1]
print(json.dumps({"y_rel": [rel(a, b) for a, b in zip(on["y"], off["y"])],
                  "y_equal": [bool(torch.equal(a, b)) for a, b in zip(on["y"], off["y"])],
                  "conv_equal": bool(torch.equal(on["conv"], off["conv"])), "rec_rel": rel(on["rec"], off["rec"]),
                  "conv_moved": bool(not torch.equal(on["conv"], start.conv)),
                  "ops_on": sorted(o for o in on["ops"] if o.startswith("graphc::")),
                  "ops_off": sorted(o for o in off["ops"] if o.startswith("graphc::"))}))
"""


def test_decoder_layers_with_the_knob_equal_the_torch_path():
    """A Gated DeltaNet decoder layer (a decode step, then a step with a prompt chunk) and a full-attention one
    (q_norm and k_norm on strided heads; then with the layer before's output to add first), bf16 on
    CPU-interpreted kernels, the knobs (gdn_fused and gdn_conv_rows) on against off. The full layer
    and a lone norm are equal bit for bit; the linear layer's outputs within one bf16 ulp of its largest (its gate
    g may differ from torch's in the last fp32 bits, which moves the core's output before it is rounded; equal
    in these rows), its conv state equal bit for bit and its recurrent state within fp32 rounding. The knob's
    operators run with it on and none with it off."""
    r = interpreted(LAYERS)
    assert r["ops_off"] == [], r
    assert r["ops_on"] == ["graphc::add_zc_rms_norm", "graphc::gated_rms_norm", "graphc::gdn_conv_row",
                           "graphc::gdn_conv_rows", "graphc::gdn_gates", "graphc::zc_rms_norm"], r
    assert len(r["y_equal"]) == 9 and r["y_equal"][4:] == [True] * 5, r
    assert max(r["y_rel"][:4]) <= 2 ** -7, r
    assert r["conv_equal"] and r["conv_moved"] and r["rec_rel"] <= 1e-5, r


# launches (ops that are not views, as graphc/simulate.py counts them: an output's torch.empty is one) of a
# zero-centred norm's torch path: x.float(), pow, mean, + eps, rsqrt, *, w.float(), 1 + w, *, .to = 10; fused:
# empty + zc_rms_norm = 2. A residual add before it: add + 10 against 2 empties + add_zc_rms_norm.
ZC_SAVES, ADD_ZC_SAVES = 10 - 2, 11 - 3
# a Gated DeltaNet layer's gates: sigmoid; A_log.float(), exp, neg; a.float(), dt_bias.float(), add, softplus, *
# = 9, against empties for beta and g + gdn_gates = 3. A decode step's conv: read_slots (index_select, zeros,
# where), causal_conv's one-row branch (cat, .float(), w.float(), *, sum, silu, y.to, the window's .to; the pool
# and the rows both bf16: no other casts), index_copy_ = 12, against empty + gdn_conv_row = 2.
GATES_SAVES, CONV_SAVES = 9 - 3, 12 - 2
# the gated norm: the core's .to(bf16), then RMSNorm (under fused_norms: empty + rms_norm = 2; torch: x.float(), pow,
# mean, + eps, rsqrt, *, .to, w * = 8), gate.float(), silu, *, .to; fused: empty + gated_rms_norm = 2
GATED_SAVES = {"fused_norms": 1 + 2 + 4 - 2, "torch": 1 + 8 + 4 - 2}


@pytest.mark.parametrize("others", [{"fused_norms": 1, "gemv": 1, "fla_gdn": 1, "gdn_slots": 1}, {}],
                         ids=["with-the-h200-knobs", "alone"])
def test_the_knob_lowers_the_simulated_launches_of_a_decode_step(others):
    """The tiny preset's LLM decode step (6 Gated DeltaNet layers, 2 full-attention ones, the final norm) traced on
    meta tensors as the compiler traces it, at 1 and 3 sequences: per linear layer its two layer norms (one with
    the residual add), the gated norm, the gates and the conv; per full layer its two layer norms and q_norm and
    k_norm; then the final norm."""
    from graphc.passes.select_backends import Backends
    from graphc.passes.simulate_steps import trace_step
    from graphc.source import load_model
    from graphc.targets import get_target
    from graphc.verify import verify_graph

    ir = verify_graph(load_model(str(ROOT / "models" / "qwen3_5.py"), "tiny").model, get_target("cpu"), 1)
    step = next(s for s in ir.steps if s.node == "llm" and s.walk == "llm_decode")
    gated = GATED_SAVES["fused_norms" if others.get("fused_norms") else "torch"]
    per_linear = ZC_SAVES + ADD_ZC_SAVES + gated + GATES_SAVES + CONV_SAVES
    per_full = ZC_SAVES + ADD_ZC_SAVES + 2 * ZC_SAVES
    want = 6 * per_linear + 2 * per_full + ZC_SAVES
    assert want == (294 if others else 330)
    for seqs in (1, 3):
        off = trace_step(ir, step, seqs, Backends({}, {"llm": others}))[0].launches
        on = trace_step(ir, step, seqs, Backends({}, {"llm": others | {"gdn_fused": 1}}))[0].launches
        assert off - on == want, (seqs, off, on)
