"""Qwen3.5's gated attention under the gated_rope knob: q_norm, k_norm and the partial rotary after them in one
launch (norm_triton._zc_norm_partial_rope, norm_ops.zc_norm_partial_rope) under Triton's interpreter on CPU,
against the torch path it replaces (qwen3_5_text.ZeroCentredRMSNorm in fp32, then apply_partial_rope: torch's
rotate-half, slices and concatenation), then a whole GatedAttention with the knob on and off.

Tolerances: in bf16 equal bit for bit (the kernel rounds the norm once and each rotary product and the sum as
torch's bf16 ops do, norm_triton._round; the mean's summation order moves a bf16 result only where its fp32
value lies within an fp32 ulp of a rounding boundary: none in these rows). In fp32 within a few fp32 ulps of
the scale. In a fresh process: TRITON_INTERPRET must be set before the kernels are defined."""
import pytest

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

from tests.unit.test_gdn_fused_triton import WATCH  # noqa: E402
from tests.unit.test_moe_triton import interpreted  # noqa: E402

KERNEL = r"""
import torch
from models.components import norm_ops
from models.components.qwen3_5_text import ZeroCentredRMSNorm, apply_partial_rope

def cmp(got, want):
    d = (got.float() - want.float()).abs()
    return {"err": d.max().item(), "scale": want.float().abs().max().item(), "equal": bool(torch.equal(got, want)),
            "shape": list(got.shape), "dtype": str(got.dtype)}

torch.manual_seed(0)
out = {}
for dt in (torch.float32, torch.bfloat16):
    for r in (6, 24):                                      # a partial rotary (Qwen3.5's quarter) and a full one
        with torch.no_grad():
            qn, kn = ZeroCentredRMSNorm(24).to(dt), ZeroCentredRMSNorm(24).to(dt)
            torch.nn.init.normal_(qn.weight, 0.0, 0.3)
            torch.nn.init.normal_(kn.weight, 0.0, 0.3)
            qkv = (2 * torch.randn(5, 2 * 3 * 24 + 2 * 24)).to(dt)  # q|gate interleaved per head, then k, then v
            q = qkv[:, :144].view(5, 3, 48)[..., :24]              # rows and heads strided, as GatedAttention's
            k = qkv[:, 144:168].view(5, 1, 24)
            cos, sin = torch.randn(5, 1, r).to(dt), torch.randn(5, 1, r).to(dt)
            gq, gk = norm_ops.zc_norm_partial_rope(q, k, qn.weight, kn.weight, cos, sin, qn.eps)
            wq, wk = apply_partial_rope(qn(q), cos, sin), apply_partial_rope(kn(k), cos, sin)
            out[f"{str(dt)[6:]}_r{r}"] = {"q": cmp(gq, wq), "k": cmp(gk, wk),
                                          "pass_moved": bool(not torch.equal(wq[..., r:], qn(q)[..., r:]))}
print(json.dumps(out))
"""


def test_one_launch_equals_the_norms_and_the_partial_rotary():
    """q and k as GatedAttention views them (strided heads of one projection), head dim 24 (not a power of two:
    the kernel masks), rotary widths 6 and 24; each output equal to the torch path in bf16, within fp32 ulps in
    fp32; the dims past the rotary are the norm's own (the torch path passes them through)."""
    out = interpreted(KERNEL)
    for key, res in out.items():
        assert not res["pass_moved"], key
        for part, shape in (("q", [5, 3, 24]), ("k", [5, 1, 24])):
            got = res[part]
            assert got["shape"] == shape, (key, got)
            if key.startswith("bfloat16"):
                assert got["equal"] and got["dtype"] == "torch.bfloat16", (key, part, got)
            else:
                assert got["err"] <= 4e-6 * got["scale"], (key, part, got)


LAYER = r"""
import torch
from graphc.modules import set_kernels
from models.components import norm_ops
from models.components.qwen3_5_text import GatedAttention
from models.components.qwen3_5_text_config import Qwen3_5TextConfig

norm_ops.KERNEL_DEVICES = ("cuda", "meta", "cpu")              # the interpreter runs the kernels on the CPU
cfg = Qwen3_5TextConfig(vocab_size=32, hidden_size=48, intermediate_size=40, num_hidden_layers=4,
                        num_attention_heads=3, num_key_value_heads=1, head_dim=24, linear_num_key_heads=2,
                        linear_num_value_heads=4, linear_key_head_dim=12, linear_value_head_dim=20,
                        mrope_section=(2, 1, 0))
torch.manual_seed(0)
layer = GatedAttention(cfg, 0)
for p in layer.parameters():
    torch.nn.init.normal_(p, 0.0, 0.3)
layer.to(torch.bfloat16).eval()
x = (2 * torch.randn(4, 48)).to(torch.bfloat16)
cos, sin = torch.randn(4, 1, 6).to(torch.bfloat16), torch.randn(4, 1, 6).to(torch.bfloat16)

""" + WATCH + r"""
runs = {}
for knob in (0, 1):
    set_kernels(layer, {"gated_rope": knob})
    seen = Seen()
    with torch.no_grad(), seen:
        y = layer(x, cos, sin, attend)
    runs[knob] = (y, sorted(o for o in seen.ops if o.startswith("graphc::")), "aten::cat" in seen.ops)
print(json.dumps({"equal": bool(torch.equal(runs[0][0], runs[1][0])), "ops_off": runs[0][1], "ops_on": runs[1][1],
                  "cat_off": runs[0][2], "cat_on": runs[1][2], "rotary": cfg.rotary_dim}))
"""


def test_gated_attention_with_the_knob_equals_the_torch_path():
    """A GatedAttention layer in bf16 (rotary width 6 of head dim 24), gated_rope on against off: equal outputs
    bit for bit, the fused launch with the knob on and no concatenation left; neither with it off."""
    r = interpreted(LAYER)
    assert r["rotary"] == 6, r
    assert r["equal"], r
    assert r["ops_off"] == [] and r["cat_off"], r
    assert r["ops_on"] == ["graphc::zc_norm_partial_rope"] and not r["cat_on"], r
