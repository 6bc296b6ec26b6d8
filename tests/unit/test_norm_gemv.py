"""The norm_gemv knob: a pre-normed one-row input's RMSNorm (and the residual add before it) taken into the
one-row product's programs (gemv_triton.norm_gemv). Under Triton's interpreter it equals, bit for bit, the two
launches it replaces (norm_triton's rms_norm or add_rms_norm, then gemv or gemv_silu_mul; those are held to
torch in test_norm_triton.py and test_gemv_triton.py), and an fp64 forward within bf16. On meta tensors (where
the compiler traces them) a code predictor layer (thinker.FoldedLayer) with the knob runs no norm launch of
its own; without it, its two."""
import pytest
import torch

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

from graphc.modules import set_kernels  # noqa: E402
from models.components.layers import SwiGLU  # noqa: E402
from models.components.thinker import Attention, FoldedLayer  # noqa: E402
from tests.unit.test_gemv_triton import REFUSALS  # noqa: E402
from tests.unit.test_moe_triton import interpreted  # noqa: E402
from tests.unit.test_pdl_knob import Calls  # noqa: E402

SCRIPT = REFUSALS + r"""
import torch
from models.components import gemv_triton as g, norm_triton as n
from models.components.gemv_ops import norm_gemv

torch.manual_seed(0)
out = {}
# (K, N, swiglu, residual, bias): K off the power of two, masked columns, K past 1,024 (8 warps)
for k, cols, swiglu, res, bias in ((100, 37, False, True, True), (64, 48, False, False, False),
                                   (1030, 130, True, True, False), (96, 40, True, False, False)):
    x, r = torch.randn(2, k, dtype=torch.bfloat16)[1:], torch.randn(1, k, dtype=torch.bfloat16)
    nw = (torch.rand(k) + 0.5).to(torch.bfloat16)
    w = (torch.randn(cols * (2 if swiglu else 1), k) / k ** 0.5).to(torch.bfloat16)
    b = torch.randn(cols, dtype=torch.bfloat16) if bias else None
    total, y = torch.empty(1, k, dtype=torch.bfloat16), torch.empty(1, cols, dtype=torch.bfloat16)
    g.norm_gemv(x, r if res else None, nw, 1e-6, w, b, total if res else None, y, swiglu)
    t2, h, y2 = torch.empty_like(total), torch.empty_like(total), torch.empty_like(y)
    n.add_rms_norm(x, r, nw, t2, h, 1e-6) if res else n.rms_norm(x, nw, h, 1e-6)
    g.gemv_silu_mul(h, w, y2) if swiglu else g.gemv(h, w, b, y2)
    s = (x.double() + r.double()) if res else x.double()
    hd = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.double()
    p = hd @ w.double().t()
    want = (torch.nn.functional.silu(p[:, :cols]) * p[:, cols:]) if swiglu else p + (b.double() if bias else 0)
    err = ((y.double() - want).abs().max() / want.abs().max()).item()
    out[f"{k}x{cols}"] = [torch.equal(y, y2), (not res) or torch.equal(total, t2), err]
row, nw = torch.randn(1, 5000, dtype=torch.bfloat16), torch.ones(5000, dtype=torch.bfloat16)
out["errors"] = refusals(lambda: norm_gemv(row, None, nw, 1e-6, torch.randn(8, 5000, dtype=torch.bfloat16), None),
                         lambda: norm_gemv(row[:, :64], None, nw[:63], 1e-6, torch.randn(8, 64), None),
                         lambda: norm_gemv(row[:, :64], None, nw[:64], 1e-6, torch.randn(7, 64), None, True))
print(json.dumps(out))
"""


def test_norm_gemv_equals_the_launches_it_replaces():
    """Bitwise the norm (with and without the residual add) then the product (with a bias; and a SwiGLU's
    gate_up with its activation), the residual's sum too; within bf16 of fp64; a row over 4,096, a norm weight
    of another width and a SwiGLU weight of odd rows refused, naming them."""
    got = interpreted(SCRIPT)
    errs = got.pop("errors")
    assert set(got) == {"100x37", "64x48", "1030x130", "96x40"}
    for shape, (same, same_total, err) in got.items():
        assert same and same_total and err < 2e-2, (shape, same, same_total, err)
    assert errs[0] and "[1, 5000]" in errs[0] and "4,096" in errs[0], errs
    assert errs[1] and "norm weight [63]" in errs[1], errs
    assert errs[2] and "[7, 64]" in errs[2] and "gate's rows then up's" in errs[2], errs


def _layer_ops(knobs: dict, rows: int = 1, delta: bool = True) -> list[str]:
    """The graphc operators a code-predictor-shaped FoldedLayer runs on meta tensors (hidden 64, 4 q heads and
    2 kv heads of 16, intermediate 96), its input x + delta (x alone where not delta)."""
    layer = FoldedLayer(64, Attention(64, 4, 2, 16, 1e-6), SwiGLU(64, 96), 1e-6).to("meta", torch.bfloat16)
    set_kernels(layer, knobs)
    x = torch.empty(rows, 64, device="meta", dtype=torch.bfloat16)
    cos = sin = torch.empty(rows, 1, 16, device="meta", dtype=torch.bfloat16)
    calls = Calls()
    with calls, torch.no_grad():
        out, y = layer(x, torch.empty_like(x) if delta else None, cos, sin, lambda q, k, v: q)
    assert out.shape == y.shape == (rows, 64)
    return [n for n, v in calls.pdl.items() for _ in v] + calls.others


KNOBS = {"fused_norms": 1, "gemv": 1, "gemv_swiglu": 2**30}


@pytest.mark.parametrize("delta", [True, False])
def test_the_knob_folds_both_norms_of_a_one_row_layer(delta):
    """With norm_gemv: the input norm in the q/k/v product, the post-attention add + norm in the gate_up launch:
    norm_gemv twice, no norm launch; q/k norm + rotary, the o and down products as before. Without: the two
    norm launches (the first without a residual where the layer's input has none), the products unfused."""
    on = sorted(_layer_ops(KNOBS | {"norm_gemv": 1}, delta=delta))
    off = sorted(_layer_ops(KNOBS, delta=delta))
    assert on == sorted(["graphc.norm_gemv"] * 2 + ["graphc.q_k_norm_rope"] + ["graphc.gemv"] * 2), on
    first = ["graphc.add_rms_norm"] if delta else ["graphc.rms_norm"]
    assert off == sorted(first + ["graphc.add_rms_norm", "graphc.gemv", "graphc.q_k_norm_rope", "graphc.gemv",
                                  "graphc.gemv_silu_mul", "graphc.gemv"]), off


def test_more_rows_or_no_fused_norms_keep_the_norm_launches():
    """Two rows take no one-row kernel, so the norms keep their launches; without fused_norms nothing folds."""
    assert "graphc.norm_gemv" not in _layer_ops(KNOBS | {"norm_gemv": 1}, rows=2)
    assert "graphc.norm_gemv" not in _layer_ops({"gemv": 1, "gemv_swiglu": 2**30, "norm_gemv": 1})


@pytest.mark.parametrize("delta", [True, False])
def test_after_norm_without_the_fold_is_the_norm_then_the_module(delta):
    """Where nothing folds (CPU, fp32), Linear.after_norm and SwiGLU.after_norm are the norm's residual add and the
    norm, then the module, worked by hand: (x + d, module(w * (t * rsqrt(mean(t^2) + eps))))."""
    from models.components.layers import Linear, RMSNorm

    torch.manual_seed(0)
    norm, lin, mlp = RMSNorm(16, 1e-6), Linear(16, 8, bias=True), SwiGLU(16, 12)
    torch.nn.init.normal_(norm.weight, 1.0, 0.1)
    x, d = torch.randn(3, 16), torch.randn(3, 16)
    t = x + d if delta else x
    h = norm.weight * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6))
    for module in (lin, mlp):
        total, y = module.after_norm(x, d if delta else None, norm)
        assert torch.equal(total, t) and torch.allclose(y, module(h), atol=1e-6), module
