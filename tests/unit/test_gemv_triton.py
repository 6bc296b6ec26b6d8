"""The one-row linear kernel (models/components/gemv_triton.py) under Triton's interpreter on CPU equals an
fp64 product within fp32 summation's rounding, with and without bias, at sizes that are not multiples of
its blocks (N and K masked), with the configured blocks and with others; its operator (gemv_ops.py) refuses
more than one row and a strided weight, naming them. In a fresh process: TRITON_INTERPRET must be set before
the kernel is defined (tests/gpu runs it compiled at the real shapes against cuBLAS)."""
import pytest

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

from tests.unit.test_moe_triton import interpreted  # noqa: E402

REFUSALS = r"""
def refusals(*calls):
    errs = []
    for bad in calls:
        try:
            bad()
            errs.append(None)
        except ValueError as e:
            errs.append(str(e))
    return errs
"""

SCRIPT = REFUSALS + r"""
import torch
from models.components import gemv_triton as g
from models.components.gemv_ops import gemv

torch.manual_seed(0)
out = {}
for n, k, blocks in ((37, 100, None), (130, 1030, None), (300, 2057, (4, 256, 4)), (5, 3, (1, 512, 4))):
    x = torch.randn(2, k)[1:]                    # a row of a wider tensor
    w, b = torch.randn(n, k), torch.randn(n)
    want = x.double() @ w.double().t()
    y = torch.empty(1, n)
    g.gemv(x, w, None, y, blocks)
    e0 = ((y.double() - want).abs().max() / want.abs().max()).item()
    g.gemv(x, w, b, y, blocks)
    e1 = ((y.double() - want - b.double()).abs().max() / want.abs().max()).item()
    out[f"{n}x{k}"] = max(e0, e1)
out["errors"] = refusals(lambda: gemv(torch.randn(2, 8), torch.randn(4, 8), None),
                         lambda: gemv(torch.randn(1, 8), torch.randn(8, 4).t(), None))
print(json.dumps(out))
"""


def test_one_row_products_equal_fp64_within_fp32_rounding():
    got = interpreted(SCRIPT)
    errs = got.pop("errors")
    assert set(got) == {"37x100", "130x1030", "300x2057", "5x3"}
    for shape, err in got.items():
        assert err < 1e-5, (shape, err)
    assert errs[0] and "one row" in errs[0] and "[2, 8]" in errs[0], errs
    assert errs[1] and "contiguous weight" in errs[1], errs


FUSED = REFUSALS + r"""
import torch
from models.components import gemv_triton as g
from models.components.gemv_ops import gemv_silu_mul
from models.components.norm_triton import silu_mul

torch.manual_seed(0)
out = {}
for i, k, blocks in ((37, 100, None), (130, 1030, None), (300, 2057, (2, 256, 4))):
    x = torch.randn(2, k, dtype=torch.bfloat16)[1:]
    w = (torch.randn(2 * i, k) / k ** 0.5).to(torch.bfloat16)
    y, two, gu = torch.empty(1, i, dtype=torch.bfloat16), torch.empty(1, i, dtype=torch.bfloat16), torch.empty(1, 2 * i)
    g.gemv_silu_mul(x, w, y, blocks)
    g.gemv(x, w, None, gu)             # fp32 out: the sums as they are; torch rounds them to bf16 as a GPU store
    silu_mul(gu.to(torch.bfloat16), two)    # does (the interpreter's own cast truncates)
    p = x.double() @ w.double().t()
    want = torch.nn.functional.silu(p[:, :i]) * p[:, i:]
    out[f"{i}x{k}"] = [torch.equal(y, two), ((y.double() - want).abs().max() / want.abs().max()).item()]
out["errors"] = refusals(lambda: gemv_silu_mul(torch.randn(1, 8), torch.randn(5, 8)),
                         lambda: gemv_silu_mul(torch.randn(2, 8), torch.randn(4, 8)))
print(json.dumps(out))
"""


def test_the_fused_swiglu_product_equals_the_two_launches_it_replaces():
    """gemv_silu_mul under the interpreter, bf16: bitwise the gate_up gemv then norm_triton's silu_mul (it rounds
    where they round), within bf16 of an fp64 silu(g) * u, with masked I and K and other blocks; it refuses a
    weight of odd rows and more than one row, naming them."""
    got = interpreted(FUSED)
    errs = got.pop("errors")
    assert set(got) == {"37x100", "130x1030", "300x2057"}
    for shape, (same, err) in got.items():
        assert same and err < 1e-2, (shape, same, err)
    assert errs[0] and "odd row count" in errs[0] and "[5, 8]" in errs[0], errs
    assert errs[1] and "one row" in errs[1], errs
