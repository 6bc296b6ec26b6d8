"""The few-rows linear kernel (models/components/gemv_triton.gemm_rows) under Triton's interpreter on CPU
equals an fp64 product within fp32 summation's rounding: 1 to 37 rows (padded to the tensor cores' 16 and
past), sizes that are not multiples of its blocks (rows, N and K masked), x and y as column slices of wider
tensors (their row strides followed), with and without bias, with the configured blocks and with others; it
refuses more than 64 rows, naming the count. In a fresh process: TRITON_INTERPRET must be set before the kernel
is defined."""
import pytest

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

from tests.unit.test_moe_triton import interpreted  # noqa: E402

SCRIPT = r"""
import torch
from models.components import gemv_triton as g

torch.manual_seed(0)
out = {}
for m, n, k, blocks in ((1, 37, 100, None), (3, 130, 1030, None), (16, 64, 48, (16, 16, 4, 2)),
                        (37, 70, 300, (64, 128, 4, 3)), (5, 70, 300, (64, 64, 4, 3)), (20, 33, 40, (16, 32, 4, 2))):
    x = torch.randn(m, k + 5)[:, 5:]                     # rows of a wider tensor
    w, b = torch.randn(n, k), torch.randn(n)
    want = x.double() @ w.double().t()
    y = torch.full((m, n + 3), float("nan"))[:, :n]
    g.gemm_rows(x, w, None, y, blocks)
    e0 = ((y.double() - want).abs().max() / want.abs().max()).item()
    g.gemm_rows(x, w, b, y, blocks)
    e1 = ((y.double() - want - b.double()).abs().max() / want.abs().max()).item()
    out[f"{m}x{n}x{k}"] = max(e0, e1)
try:
    g.gemm_rows(torch.randn(65, 8), torch.randn(4, 8), None, torch.empty(65, 4))
    out["error"] = None
except ValueError as e:
    out["error"] = str(e)
print(json.dumps(out))
"""


def test_few_row_products_equal_fp64_within_fp32_rounding():
    got = interpreted(SCRIPT)
    err = got.pop("error")
    assert set(got) == {"1x37x100", "3x130x1030", "16x64x48", "37x70x300", "5x70x300", "20x33x40"}
    for shape, rel in got.items():
        assert rel < 1e-5, f"{shape}: relative error {rel:.3g} against fp64"
    assert err is not None and "65 rows" in err and "1 to 64" in err


NORM_SCRIPT = r"""
import torch
from models.components import gemv_triton as g

torch.manual_seed(1)
out = {}
for m, n, k, res, bias, swiglu in ((3, 37, 300, True, True, False), (16, 64, 100, False, False, False),
                                   (20, 2 * 24, 600, True, False, True), (5, 2 * 40, 48, False, False, True)):
    x = torch.randn(m, k + 3)[:, 3:] * 3                 # rows of a wider tensor
    r = torch.randn(m, k) if res else None
    nw, w = torch.rand(k) + 0.5, torch.randn(n, k)
    b = torch.randn(n) if bias else None
    t = (x.double() + r.double()) if res else x.double()
    h = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.double()
    p = h @ w.double().t() + (b.double() if bias else 0)
    want = torch.nn.functional.silu(p[:, :n // 2]) * p[:, n // 2:] if swiglu else p
    y = torch.full((m, want.shape[1]), float("nan"))
    total = torch.full((m, k), float("nan")) if res else None
    g.norm_gemm_rows(x, r, nw, 1e-6, w, b, total, y, swiglu)
    key = f"{m}x{n}x{k}" + ("+res" if res else "") + ("+bias" if bias else "") + ("+swiglu" if swiglu else "")
    out[key] = [((y.double() - want).abs().max() / want.abs().max()).item(),
                None if total is None else (total - (x + r)).abs().max().item()]       # torch's add
print(json.dumps(out))
"""


def test_normed_few_row_products_equal_fp64_within_fp32_rounding():
    """norm_gemm_rows: rms_norm(x (+ r)) * nw then the product (or a SwiGLU's silu(g) * u), against fp64, with the
    residual's sum written exactly, at K over one block (the rows' squares summed in two) and under one."""
    got = interpreted(NORM_SCRIPT)
    assert set(got) == {"3x37x300+res+bias", "16x64x100", "20x48x600+res+swiglu", "5x80x48+swiglu"}
    for shape, (rel, total_err) in got.items():
        assert rel < 2e-5, f"{shape}: relative error {rel:.3g} against fp64"
        assert total_err in (None, 0.0), f"{shape}: the residual's sum off by {total_err}"
