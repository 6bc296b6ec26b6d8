"""The frame_attend knob's kernel (models/components/frame_triton.py) under Triton's interpreter: a code predictor
frame's steps (2 rows at slot 0, then a row a slot) through the one launch against the two it replaces. The
cache's slots hold the bits q_k_norm_rope writes (norm_triton.py; held to torch in test_norm_triton.py), and the
output is the causal attention of the step's rows over the frame's slots so far, computed here in fp32 torch
from that cache (within one ulp of it in the output's dtype), and its mean error against fp64 from the step's
raw q, k and v is that path's own. On meta tensors a code predictor layer with the knob makes one launch where it
made two."""
import pytest
import torch

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

from tests.unit.test_gemv_triton import REFUSALS  # noqa: E402
from tests.unit.test_moe_triton import interpreted  # noqa: E402

SCRIPT = REFUSALS + r"""
import math
import torch
from models.components import norm_triton
from models.components.frame_ops import frame_attend

def rope64(x, c, s):
    h = x.shape[-1] // 2
    return x * c + torch.cat((-x[..., h:], x[..., :h]), -1) * s

def steps(S, HQ, HK, D, G, dtype, seed):
    torch.manual_seed(seed)
    wq, wk = (torch.rand(D) + 0.5).to(dtype), (torch.rand(D) + 0.5).to(dtype)
    pos = torch.arange(G, dtype=torch.float64)[:, None] / (10000 ** (torch.arange(0, D, 2) / D))[None]
    c64, s64 = torch.cat((pos.cos(), pos.cos()), -1), torch.cat((pos.sin(), pos.sin()), -1)      # [G, D]
    cos, sin = c64.to(dtype)[:, None], s64.to(dtype)[:, None]                                   # [G, 1, D]
    cache = [torch.zeros(S, G, h, D, dtype=dtype) for h in (HQ, HK, HK)]
    old = [torch.zeros_like(c) for c in cache]
    k64, v64 = torch.zeros(S, G, HK, D, dtype=torch.float64), torch.zeros(S, G, HK, D, dtype=torch.float64)
    res = {"cache_equal": [], "ulp": [], "err": [], "err_ref": []}
    for j in range(G - 1):
        first, n = (0, 2) if j == 0 else (j + 1, 1)
        qkv = torch.randn(S, n, (HQ + 2 * HK) * D, dtype=dtype) * 3      # a product's rows, heads strided views
        q, k, v = qkv.split((HQ * D, HK * D, HK * D), -1)
        q, k, v = q.view(S, n, HQ, D), k.view(S, n, HK, D), v.view(S, n, HK, D)
        sl = slice(first, first + n)
        o = frame_attend(q, k, v, wq, wk, cos[sl], sin[sl], tuple(cache), first, 1e-6, False)
        # the launch it replaces: q_k_norm_rope into the cache's slots (then the resource's attention, below)
        ys = [torch.empty(S * n, h, D, dtype=dtype) for h in (HQ, HK, HK)]
        norm_triton.q_k_norm_rope(q.reshape(S * n, HQ, D), k.reshape(S * n, HK, D), wq, wk, cos[sl, 0].repeat(S, 1),
                                  sin[sl, 0].repeat(S, 1), ys[0], ys[1], 1e-6, v.reshape(S * n, HK, D), ys[2])
        for a, y in zip(old, ys):
            a[:, sl] = y.view(S, n, -1, D)
        res["cache_equal"].append(all(torch.equal(a, b) for a, b in zip(cache, old)))
        g = HQ // HK
        # causal attention of the step's rows over the frame, fp32 from the cache
        qf, kf, vf = old[0][:, sl].float(), old[1][:, :first + n].float(), old[2][:, :first + n].float()
        sc = torch.einsum("snhd,schd->snhc", qf, kf.repeat_interleave(g, 2)) / math.sqrt(D)
        keep = torch.arange(first + n)[None, :] <= torch.arange(first, first + n)[:, None]       # [n, c]
        sc = sc.masked_fill(~keep[None, :, None, :], float("-inf"))
        ref = torch.einsum("snhc,schd->snhd", sc.softmax(-1), vf.repeat_interleave(g, 2))
        rb = ref.to(dtype).float()                      # the fp32 attention rounded to the output's dtype
        if dtype == torch.bfloat16:                     # in its ulps
            res["ulp"].append(((o.float() - rb).abs() / 2.0 ** (torch.frexp(rb).exponent - 8).float()).max().item())
        else:                                           # relative to its scale
            res["ulp"].append(((o - ref).abs().max() / ref.abs().mean()).item())
        # fp64 from the raw rows: norm, rotary, attention
        def nr(x, w):
            x = x.double()
            return rope64(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double(),
                          c64[sl][None, :, None], s64[sl][None, :, None])
        q64 = nr(q, wq)
        k64[:, sl], v64[:, sl] = nr(k, wk), v.double()
        s2 = torch.einsum("snhd,schd->snhc", q64, k64[:, :first + n].repeat_interleave(g, 2)) / math.sqrt(D)
        s2 = s2.masked_fill(~keep[None, :, None, :], float("-inf"))
        want = torch.einsum("snhc,schd->snhd", s2.softmax(-1), v64[:, :first + n].repeat_interleave(g, 2))
        scale = want.abs().mean().item()
        res["err"].append(((o.double() - want).abs().mean() / scale).item())
        res["err_ref"].append(((ref.to(dtype).double() - want).abs().mean() / scale).item())
    return res

out = {"bf16_talker": steps(1, 16, 8, 128, 16, torch.bfloat16, 0),      # the code predictor's heads and frame
       "bf16_small": steps(3, 4, 2, 64, 5, torch.bfloat16, 1),          # a frame of 5 slots (8 key rows, masked)
       "fp32_small": steps(3, 4, 1, 32, 4, torch.float32, 2)}           # four query heads a kv head
x = torch.randn(1, 1, 4, 48, dtype=torch.bfloat16)
c = [torch.zeros(1, 4, 4, 48, dtype=torch.bfloat16)] * 3
w, t = torch.ones(48, dtype=torch.bfloat16), torch.ones(1, 48, dtype=torch.bfloat16)
y = torch.randn(1, 1, 4, 64, dtype=torch.bfloat16)
cy = [torch.zeros(1, 4, 4, 64, dtype=torch.bfloat16)] * 3
wy, ty = torch.ones(64, dtype=torch.bfloat16), torch.ones(1, 64, dtype=torch.bfloat16)
out["errors"] = refusals(lambda: frame_attend(x, x, x, w, w, t, t, tuple(c), 0, 1e-6, False),
                         lambda: frame_attend(y, y, y, wy, wy, ty, ty, tuple(cy), 4, 1e-6, False),
                         lambda: frame_attend(y, y, y, wy, wy, ty, ty, (cy[0], cy[1], cy[2].float()), 0, 1e-6, False))
print(json.dumps(out))
"""


def test_frame_attend_equals_the_launches_it_replaces():
    """Every step of a frame: the cache bit for bit q_k_norm_rope's, the output within one ulp of fp32 attention
    over that cache rounded, and its mean error against fp64 within 1.1x that path's own; a head dim of 48, slots
    past the frame and a cache of another dtype refused, naming them."""
    got = interpreted(SCRIPT)
    errs = got.pop("errors")
    for case, res in got.items():
        assert all(res["cache_equal"]), (case, res["cache_equal"])
        # bf16: an element rounds the other way at most; fp32: the sums' order
        assert max(res["ulp"]) <= (1 if case.startswith("bf16") else 1e-5), (case, res["ulp"])
        for err, ref in zip(res["err"], res["err_ref"]):
            assert err <= 1.1 * ref + 1e-7, (case, res["err"], res["err_ref"])
    assert "head dim 48" in errs[0] and "power of two" in errs[0], errs[0]
    assert "slots 4..4" in errs[1] and "inside G" in errs[1], errs[1]
    assert "one dtype" in errs[2], errs[2]


MODULE = r"""
import torch
from graphc.modules import set_kernels
from models.components.talker import CodePredictor
from tests.unit.test_kernel_choice import _code_predictor_frame

CodePredictor.fuses_frame = lambda self, x: bool(self.frame_attend)     # on CPU tensors: the interpreter runs it
out = {}
for dtype in (torch.float32, torch.bfloat16):
    runs = []
    for knob in (0, 1):
        cp, x, cos, sin, cache = _code_predictor_frame("cpu", dtype, 2)
        for p in cp.parameters():
            torch.nn.init.normal_(p, 0.0, 0.3)
        set_kernels(cp, {"frame_attend": knob})
        if knob:                                        # the kernel reads no slot before writing it
            for c in (cache.q, cache.k, cache.v):
                c.fill_(float("nan"))
        called = []
        attn = cache.attn
        cache.attn = lambda q, k, v: called.append(1) or attn(q, k, v)
        torch.manual_seed(1)
        logits = [cp.run(x, slice(0, 2), cos, sin, cache, cp.lm_head[0])]
        for j in (1, 2):                                # the frame's later slots, a row each
            logits.append(cp.run(torch.randn(2, 1, 32, dtype=dtype), slice(j + 1, j + 2), cos, sin, cache,
                                 cp.lm_head[j]))
        runs.append((torch.stack(logits).double(), len(called), [c.clone() for c in (cache.q, cache.k, cache.v)]))
    (a, calls_off, c_off), (b, calls_on, c_on) = runs
    out[str(dtype)] = {"rel": ((a - b).abs().max() / a.abs().max()).item(), "calls": [calls_off, calls_on],
                       "kv_rel": max(((u.double() - w.double()).abs().max() / u.double().abs().max()).item()
                                     for u, w in zip(c_off[1:], c_on[1:]))}
print(json.dumps(out))
"""


def test_a_code_predictor_frame_with_the_knob_equals_one_without():
    """A 3-layer code predictor's frame (2 rows at slot 0, then slots 2 and 3), the knob forced on CPU tensors under
    the interpreter: fp32 logits within 1e-5 of the path without it (q_k_norm_rope's torch path and the frame's
    causal attention), bf16 within its roundings, its frame cache filled with NaN first (no slot is read before it
    is written); the resource's attention called 3 layers x 3 passes without the knob and never with it; the
    cache's k and v the same."""
    got = interpreted("import json\n" + MODULE)
    f32, b16 = got["torch.float32"], got["torch.bfloat16"]
    assert f32["calls"] == b16["calls"] == [9, 0], got
    assert f32["rel"] < 1e-5 and f32["kv_rel"] < 1e-6, f32
    assert b16["rel"] < 3e-2 and b16["kv_rel"] < 1e-2, b16


def test_on_meta_the_knob_makes_one_launch_a_layer():
    """Where the compiler traces (bf16, meta): a code predictor pass of 2 sequences with the knob at 1 or 2 (from
    that many sequences) runs graphc.frame_attend once a layer and neither q_k_norm_rope nor the resource's
    attention; without it, or at 3, q_k_norm_rope once a layer."""
    from graphc.modules import set_kernels
    from tests.unit.test_kernel_choice import OpNames, _code_predictor_frame, graphc_ops

    for knob in (1, 2, 0, 3):
        cp, x, cos, sin, cache = _code_predictor_frame("meta", torch.bfloat16, 2, 1)
        set_kernels(cp, {"fused_norms": 1, "frame_attend": knob})
        called = []
        attn = cache.attn
        cache.attn = lambda q, k, v: called.append(1) or attn(q, k, v)
        out, seen = OpNames.of(lambda: cp.run(x, slice(2, 3), cos, sin, cache, cp.lm_head[1]))
        ops = graphc_ops(seen)
        assert out.shape == (2, 16)
        fused, plain = ops.count("graphc.frame_attend"), ops.count("graphc.q_k_norm_rope")
        assert (fused, plain, len(called)) == ((3, 0, 0) if knob in (1, 2) else (0, 3, 3)), (knob, ops, called)


def test_with_the_knob_the_frame_cache_is_not_zeroed():
    """A whole code predictor step on meta (bf16): with the knob its frame cache (q, k, v) is allocated and not
    zeroed, since the kernel reads only slots it wrote; without it, or where the step has fewer sequences than
    the knob's value, three zero fills (masked slots enter the resource's softmax(.) @ V)."""
    from graphc.modules import set_kernels
    from tests.unit.test_kernel_choice import OpNames, _code_predictor_frame

    fills = {}
    for knob in (2, 0, 3):
        cp, x, cos, sin, cache = _code_predictor_frame("meta", torch.bfloat16, 2)
        set_kernels(cp, {"fused_norms": 1, "fused_sampler": 1, "frame_attend": knob})
        noise = torch.empty(2, 3, 16, device="meta")
        params = torch.zeros(2, 3, device="meta")
        (codes, _), seen = OpNames.of(lambda: cp(x[:, 0], x[:, 1], cache.attn, params, noise))
        assert codes.shape == (2, 3)
        fills[knob] = sum(o.startswith(("aten.new_zeros", "aten.zeros", "aten.fill_", "aten.zero_")) for o in seen)
    assert fills[0] - fills[2] == 3 and fills[3] == fills[0], fills
