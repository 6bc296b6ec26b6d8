"""The fused norm kernels (models/components/norm_triton.py) under Triton's interpreter on CPU equal the
torch path they replace (layers.RMSNorm, a residual add before it, thinker.Attention's qk-norm and rotary
embedding): in fp32 within fp32's rounding, in bf16 equal but for the mean's summation order (the kernels
round where the torch path rounds, in integer ops: Triton 3.6's interpreter casts fp32 to bf16 by
truncation, where the GPU and torch round to nearest, and its compiler folded a cast's rounding away; the
residual sum bit for bit). tests/gpu/test_norm_triton_gpu.py checks the same on the GPU. Rows are strided views as the layers pass them (q and k as views of their projection's
output), sizes not powers of two where the kernels mask. In a fresh process: TRITON_INTERPRET must be set
before the kernels are defined (tests/gpu runs the compiled kernels at the real shapes)."""
import pytest

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

from tests.unit.test_moe_triton import interpreted  # noqa: E402

SCRIPT = r"""
import torch
from models.components.layers import RMSNorm, apply_rope
from models.components import norm_ops

torch.manual_seed(0)
out = {}
for dtype in (torch.float32, torch.bfloat16):
    T, D, H, KV, HD = 5, 96, 6, 2, 16     # 6 q heads: a full and a part block of 4
    norm = RMSNorm(D, 1e-6)
    torch.nn.init.normal_(norm.weight, 1.0, 0.3)
    qn = RMSNorm(HD, 1e-6)
    torch.nn.init.normal_(qn.weight, 1.0, 0.3)
    norm, qn = norm.to(dtype), qn.to(dtype)
    big = torch.randn(T, 2 * D).to(dtype)
    x = big[:, :D]                                  # rows strided, as a slice of a wider tensor
    r = (0.5 * torch.randn(T, D)).to(dtype)
    proj = torch.randn(T, (H + KV) * HD).to(dtype)   # q and k, views of one projection output
    q = proj[:, :H * HD].view(T, H, HD)
    ang, ang2 = torch.rand(T, 1, HD // 2) * 6.0, torch.rand(T, 1, HD // 2) * 6.0
    # a table's halves unlike (a model's repeat one half): a kernel must read each column's own cos and sin
    cos = torch.cat([ang.cos(), ang2.cos()], -1).to(dtype)
    sin = torch.cat([ang.sin(), ang2.sin()], -1).to(dtype)
    with torch.no_grad():
        res = {}
        want, got = norm(x), norm_ops.rms_norm(x, norm.weight, norm.eps)
        res["rms_norm"] = (got.float() - want.float()).abs().max().item()
        tw = x + r
        wn = norm(tw)
        tg, gn = norm_ops.add_rms_norm(x, r, norm.weight, norm.eps)
        res["add_total"] = (tg.float() - tw.float()).abs().max().item()
        res["add_norm"] = (gn.float() - wn.float()).abs().max().item()
        wq = apply_rope(qn(q), cos, sin)
        gq = norm_ops.qk_norm_rope(q, qn.weight, cos, sin, qn.eps)
        res["qk_norm_rope"] = (gq.float() - wq.float()).abs().max().item()
        # the code predictor's layout: rows [S, n], one table row per slot n shared by the S sequences
        # (n = 2 cannot be said with one stride and is copied; n = 1 is read in place, stride 0)
        for n in (2, 1):
            xs = proj[:, :H * HD].reshape(T, 1, H, HD).expand(T, n, H, HD)[:, :n] * torch.arange(1, n + 1).to(dtype)[:, None, None]
            cs, sn = cos[:n], sin[:n]                 # [n, 1, HD]
            wb = apply_rope(qn(xs), cs, sn)
            gb = norm_ops.qk_norm_rope(xs, qn.weight, cs, sn, qn.eps)
            res[f"broadcast_{n}"] = (gb.float() - wb.float()).abs().max().item()
            res["shapes_b"] = res.get("shapes_b", []) + [list(gb.shape)]
        # q and k of the same rows in one launch: each equal to its own launch, bit for bit
        k_in = proj[:, H * HD:].view(T, KV, HD)
        kn = RMSNorm(HD, 1e-6)
        torch.nn.init.normal_(kn.weight, 1.0, 0.3)
        kn = kn.to(dtype)
        bq, bk = norm_ops.q_k_norm_rope(q, k_in, qn.weight, kn.weight, cos, sin, qn.eps)
        res["q_k_same"] = bool(torch.equal(bq, gq) and torch.equal(bk, norm_ops.qk_norm_rope(k_in, kn.weight, cos, sin, kn.eps)))
        res["q_k_err"] = (bk.float() - apply_rope(kn(k_in), cos, sin).float()).abs().max().item()
        # with v: its copy from the same launch into slots of a wider cache (rows strided), q and k unchanged
        v_in = (3 * torch.randn(T, KV + 1, HD)).to(dtype)[:, 1:]
        cq, ck, cv = (torch.zeros(T, 3, h, HD, dtype=dtype) for h in (H, KV, KV))
        got3 = norm_ops.q_k_norm_rope(q, k_in, qn.weight, kn.weight, cos, sin, qn.eps, (cq[:, 1], ck[:, 1], cv[:, 1]), v_in)
        res["q_k_v_same"] = bool(torch.equal(got3[0], bq) and torch.equal(got3[1], bk) and torch.equal(cv[:, 1], v_in)
                                 and not cv[:, 0].any() and not cv[:, 2].any())
        res["differ"] = {k: (a != b).float().mean().item() for k, (a, b) in
                         {"rms_norm": (got, want), "add_norm": (gn, wn), "qk_norm_rope": (gq, wq)}.items()}
        res["scale"] = max(want.float().abs().max().item(), wq.float().abs().max().item())
        res["shapes"] = [list(got.shape), list(gn.shape), list(gq.shape)]
    out[str(dtype)] = res
print(json.dumps(out))
"""


# the rotary kernels at one head a program and at 4 heads over 2 warps (6 q heads: a full and a part block),
# whichever ROPE_HEADS (and ROPE_F32_HEADS) would take for these 5 rows
HEADS = ("from models.components import norm_triton\nnorm_triton.ROPE_HEADS = {{'few': {0}, 'many': {0}}}\n"
         "norm_triton.ROPE_F32_HEADS = norm_triton.ROPE_HEADS\n")


@pytest.mark.parametrize("heads", [(1, 1), (4, 2)])
def test_fused_norms_equal_the_torch_path_in_the_interpreter(heads):
    r = interpreted(HEADS.format(heads) + SCRIPT)
    f32, bf16 = r["torch.float32"], r["torch.bfloat16"]
    assert f32["shapes"] == [[5, 96], [5, 96], [5, 6, 16]]
    assert f32["shapes_b"] == [[5, 2, 6, 16], [5, 1, 6, 16]]
    assert f32["q_k_same"] and bf16["q_k_same"] and f32["q_k_err"] <= 2e-6 * f32["scale"], (f32, bf16)
    assert f32["q_k_v_same"] and bf16["q_k_v_same"]
    for k in ("rms_norm", "add_total", "add_norm", "qk_norm_rope", "broadcast_2", "broadcast_1"):
        assert f32[k] <= 2e-6 * f32["scale"], (k, f32)
    assert bf16["add_total"] == 0.0, bf16                     # the sum rounds once, as x + r does
    for k in ("broadcast_2", "broadcast_1"):
        assert bf16[k] <= 2 ** -6 * bf16["scale"], (k, bf16)
    for k in ("rms_norm", "add_norm", "qk_norm_rope"):        # a few elements an ulp or two off at most
        assert bf16[k] <= 2 ** -6 * bf16["scale"] and bf16["differ"][k] <= 0.02, (k, bf16)


SNAKE = r"""
import torch
from models.components.code2wav import SnakeBeta
from models.components.norm_ops import snake_beta

torch.manual_seed(0)
act = SnakeBeta(5)
with torch.no_grad():
    act.alpha.normal_(0, 0.5)
    act.beta.normal_(0, 0.5)
    x = torch.randn(2, 5, 1200) * 3
    want = act(x)                                   # the torch path (fp32: the knob acts on bf16 only)
    got = snake_beta(x, act.alpha, act.beta)
    # a ConvTranspose's trimmed output: channels strided, samples contiguous from an offset
    wide = torch.randn(2, 5, 1210) * 3
    part = wide[..., 5:1205]
    want_part, got_part = act(part), snake_beta(part, act.alpha, act.beta)
print(json.dumps({"err": (got - want).abs().max().item(), "scale": want.abs().max().item(),
                  "part_err": (got_part - want_part).abs().max().item(), "contiguous": part.is_contiguous(),
                  "shape": list(got.shape), "dtype": str(got.dtype)}))
"""


def test_fused_snake_beta_equals_the_torch_path_in_the_interpreter():
    """Code2Wav's SnakeBeta as one kernel: 1,200 samples (two 1,024-sample blocks, the second partial), five
    channels with their own alpha and beta, and a strided input (a trimmed view) as the decoder passes it."""
    r = interpreted(SNAKE)
    assert r["shape"] == [2, 5, 1200] and r["dtype"] == "torch.float32" and not r["contiguous"]
    assert r["err"] <= 1e-5 * r["scale"] and r["part_err"] <= 1e-5 * r["scale"], r


SILU = r"""
import torch
from models.components.layers import SwiGLU
from models.components.norm_ops import silu_mul
from graphc.modules import set_kernels

torch.manual_seed(0)
out = {}
for dtype in (torch.float32, torch.bfloat16):
    # 1,100 columns a half: a full 1,024-column block, then a partial one; rows strided (a slice of a wider tensor)
    wide = (2 * torch.randn(3, 2, 2200 + 6)).to(dtype)
    gu = wide[:, 1, 3:2203]
    gate, up = gu[:, :1100], gu[:, 1100:]
    want = torch.nn.functional.silu(gate) * up          # the torch path SwiGLU takes
    got = silu_mul(gu)
    out[str(dtype)] = {"err": (got.float() - want.float()).abs().max().item(), "scale": want.float().abs().max().item(),
                       "differ": (got != want).float().mean().item(), "shape": list(got.shape),
                       "strided": not gu.is_contiguous()}
# through the module on meta tensors (where the compiler traces it): the knob takes the fused operator
mlp = SwiGLU(8, 6).to("meta", torch.bfloat16)
set_kernels(mlp, {"fused_norms": 1})
ops = []
from torch.utils._python_dispatch import TorchDispatchMode
class Seen(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))
with Seen():
    y = mlp(torch.empty(5, 8, device="meta", dtype=torch.bfloat16))
out["meta"] = {"ops": ops, "shape": list(y.shape)}
print(json.dumps(out))
"""


def test_fused_silu_mul_equals_the_torch_path_in_the_interpreter():
    """SwiGLU's activation as one kernel: silu(gate) * up over strided [gate | up] rows, fp32 and bf16 (rounded
    where torch rounds: silu's output, then the product), and the module taking it on meta tensors when the
    plan's knob is on (one GEMM for gate and up, one activation launch, the down GEMM)."""
    r = interpreted(SILU)
    for dtype in ("torch.float32", "torch.bfloat16"):
        d = r[dtype]
        assert d["shape"] == [3, 1100] and d["strided"], d
    assert r["torch.float32"]["err"] <= 2e-6 * r["torch.float32"]["scale"], r
    bf16 = r["torch.bfloat16"]
    assert bf16["err"] <= 2 ** -7 * bf16["scale"] and bf16["differ"] <= 0.02, bf16
    assert r["meta"]["shape"] == [5, 8]
    assert [o for o in r["meta"]["ops"] if o in ("mm", "addmm", "silu", "mul", "silu_mul")] == ["mm", "silu_mul", "mm"], r


# the vision encoder's rotary: q and k (strided views of one [T, 3, H, 72] projection; 72 is not a power of two)
# in fp32 with fp32 tables, rounded once to their dtype: equal to the torch path bit for bit
ROPE_F32 = r"""
import torch
from models.components.layers import apply_rope
from models.components import norm_ops

torch.manual_seed(0)
out = {}
for dtype in (torch.float32, torch.bfloat16):
    T, H, D = 5, 6, 72
    qkv = (3 * torch.randn(T, 3, H, D)).to(dtype)
    q, k = qkv[:, 0], qkv[:, 1, :4]                  # k: fewer heads than q, a part block
    ang = torch.rand(T, 1, D // 2) * 50.0
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)     # fp32, as VisionEncoder.rotary
    with torch.no_grad():
        gq, gk = norm_ops.q_k_rope_f32(q, k, cos, sin)
        wq, wk = apply_rope(q.float(), cos, sin).to(dtype), apply_rope(k.float(), cos, sin).to(dtype)
        v = qkv[:, 2, 1:6]                           # v's copy in the same launch, all three padded to 128
        junk = [torch.full((T, h, 128), float("nan"), dtype=dtype) for h in (6, 4, 5)]
        del junk                                     # (freed blocks the outputs may reuse: pads must be written)
        pq, pk, pv = norm_ops.q_k_rope_f32(q, k, cos, sin, v=v, width=128)
    pads = [torch.nn.functional.pad(x, (0, 128 - D)) for x in (wq, wk, v)]
    out[str(dtype)] = {"equal": bool(torch.equal(gq, wq) and torch.equal(gk, wk)),
                       "differ": ((gq != wq).float().mean().item(), (gk != wk).float().mean().item()),
                       "shapes": [list(gq.shape), list(gk.shape)], "dtypes": [str(gq.dtype), str(gk.dtype)],
                       "padded_equal": [bool(torch.equal(a, b)) for a, b in zip((pq, pk, pv), pads)],
                       "padded_shapes": [list(x.shape) for x in (pq, pk, pv)]}
print(json.dumps(out))
"""


@pytest.mark.parametrize("heads", [(1, 1), (4, 2), (16, 4)])
def test_fp32_rotary_equals_the_torch_path_in_the_interpreter(heads):
    r = interpreted(HEADS.format(heads) + ROPE_F32)
    for dt in ("torch.float32", "torch.bfloat16"):
        assert r[dt]["shapes"] == [[5, 6, 72], [5, 4, 72]] and r[dt]["dtypes"] == [dt, dt], r
        assert r[dt]["equal"], (dt, r[dt])
        assert r[dt]["padded_shapes"] == [[5, 6, 128], [5, 4, 128], [5, 5, 128]], r[dt]
        assert r[dt]["padded_equal"] == [True, True, True], (dt, r[dt])


# nn.LayerNorm (the vision tower's, 1,152 wide: here 200, not a power of two) and the residual add before it
LAYER_NORM = r"""
import torch
from models.components.layers import LayerNorm
from models.components import norm_ops

torch.manual_seed(0)
out = {}
for dtype in (torch.float32, torch.bfloat16):
    T, D = 7, 200
    norm = LayerNorm(D, eps=1e-6)
    torch.nn.init.normal_(norm.weight, 1.0, 0.3)
    torch.nn.init.normal_(norm.bias, 0.0, 0.5)
    norm = norm.to(dtype)
    big = (3 * torch.randn(T, 2 * D) + 1.5).to(dtype)
    x = big[:, :D]                                  # rows strided, as a slice of a wider tensor
    r = torch.randn(T, D).to(dtype)
    with torch.no_grad():
        want, got = norm(x), norm_ops.layer_norm(x, norm.weight, norm.bias, norm.eps)
        tw = x + r
        wn = norm(tw)
        tg, gn = norm_ops.add_layer_norm(x, r, norm.weight, norm.bias, norm.eps)
    # an ulp of each element where bf16 rounds (two fp32 rows a few fp32 ulps apart round an ulp apart at
    # most), plus fp32's own rounding of the row (its scale times 1e-5)
    scale = want.float().abs().max().item()
    ulp = want.float().abs() * (2 ** -7 if dtype == torch.bfloat16 else 0.0) + 1e-5 * scale
    out[str(dtype)] = {"norm_ulps": ((got.float() - want.float()).abs() / ulp).max().item(),
                       "add_norm_ulps": ((gn.float() - wn.float()).abs() / ulp).max().item(),
                       "total_equal": bool(torch.equal(tg, tw)),
                       "differ": ((got != want).float().mean().item(), (gn != wn).float().mean().item()),
                       "shapes": [list(got.shape), list(tg.shape), list(gn.shape)], "dtype": str(got.dtype)}
print(json.dumps(out))
"""


def test_layer_norm_and_its_residual_add_equal_the_torch_path_in_the_interpreter():
    """layer_norm and add_layer_norm against nn.LayerNorm (and x + r): the residual sum bit for bit; the norm
    within fp32's rounding, in bf16 within an ulp of each element (only the mean's and variance's summation
    order differ: torch's against two passes in fp32), most elements equal."""
    r = interpreted(LAYER_NORM)
    for dt in ("torch.float32", "torch.bfloat16"):
        got = r[dt]
        assert got["shapes"] == [[7, 200]] * 3 and got["dtype"] == dt, got
        assert got["total_equal"], got
        assert got["norm_ulps"] <= 1.0 and got["add_norm_ulps"] <= 1.0, got
    assert max(r["torch.bfloat16"]["differ"]) <= 0.02, r      # bf16: all but a few elements equal
