"""The fused MoE kernels (models/components/moe_triton.py) under Triton's interpreter on CPU equal
Experts.forward's batched fp32 path (itself equal to HF's MoE block: tests/parity) on a small random
config with uneven routing: one expert chosen by more pairs than a BLOCK_M tile holds, one by none, and
sizes that are not multiples of the tiles. In a fresh process: TRITON_INTERPRET must be set before the
kernels are defined (tests/gpu runs the compiled kernels at the real shapes)."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

ROOT = Path(__file__).resolve().parents[2]


def interpreted(script: str) -> dict:
    """The last JSON line a script prints, run in a fresh process under Triton's interpreter (TRITON_INTERPRET
    must be set before the kernels are defined) with the project importable. Then every kernel launch it made
    is compiled for sm_90 in another process (tests/sm90_compile.py), where this Triton can target CUDA."""
    from tests.sm90_compile import RECORDER

    pre = 'import json, os, sys\nos.environ["TRITON_INTERPRET"] = "1"\nsys.path.insert(0, sys.argv[1])\n'
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GRAPHC_SM90_LAUNCHES=str(Path(tmp) / "launches.json"))
        out = subprocess.run([sys.executable, "-c", pre + RECORDER + script, str(ROOT)], capture_output=True,
                             text=True, timeout=600, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        if importlib.util.find_spec("triton.backends.nvidia") is not None:
            built = subprocess.run([sys.executable, str(ROOT / "tests" / "sm90_compile.py"), env["GRAPHC_SM90_LAUNCHES"],
                                    str(ROOT)], capture_output=True, text=True, timeout=900)
            assert built.returncode == 0, "a kernel the interpreter ran does not compile for sm_90:\n" + \
                built.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])

SCRIPT = r"""
import torch
from models.components.moe import Experts
from models.components.moe_ops import fused_experts
from models.components.moe_triton import BLOCKS

torch.manual_seed(0)
E, H, I, T, K = 8, 80, 48, 21, 3
ex = Experts(E, H, I)
torch.nn.init.normal_(ex.gate_up_proj, std=0.2)
torch.nn.init.normal_(ex.down_proj, std=0.2)
x = torch.randn(T, H)
g = torch.Generator().manual_seed(1)
others = torch.stack([torch.randperm(5, generator=g)[:K - 1] + 3 for _ in range(T)])   # experts 3..7 ...
others[others == 7] = 0                                                                  # ... but never 7
experts = torch.cat([torch.full((T, 1), 2), others], dim=1)                             # 2: all T tokens
weights = torch.rand(T, K, generator=g)
with torch.no_grad():
    want = ex(x, experts, weights)
    got = fused_experts(x, ex.gate_up_proj, ex.down_proj, experts, weights)
    # the decoder layer's residual added in the slots' sum (moe_sum_add), residual rows strided
    res = torch.randn(T, 2 * H)[:, 5:5 + H]
    got_res = fused_experts(x, ex.gate_up_proj, ex.down_proj, experts, weights, residual=res)
print(json.dumps({"err": (got - want).abs().max().item(), "scale": want.abs().max().item(),
                  "res_err": (got_res - (want + res)).abs().max().item(),
                  "shape": list(got.shape), "counts": torch.bincount(experts.reshape(-1), minlength=E).tolist(),
                  "block_m": BLOCKS["gate_up"][0]}))
"""


# the path of many tokens, taken here at 21: pairs grouped by torch's sort, a program per 16-row tile of an
# expert's pairs (expert 2's 21 pairs take two tiles, the second partial; expert 7's none)
TILED = r"""
from models.components import moe_ops, moe_triton
moe_triton.TILED_FROM = moe_ops.GROUP_SORT_FROM = 0
moe_triton.TILED = {"gate_up": (16, 32, 32, 4, 3), "down": (16, 32, 32, 4, 3)}
moe_triton.BLOCKS = {"gate_up": (16, 32, 32, 4, 3), "down": (16, 32, 32, 4, 3)}
"""


@pytest.mark.parametrize("path", ["small", "tiled", "tiled_tma"])      # tiled: without TMA (moe_triton._tma)
def test_fused_experts_equal_the_reference_path_in_the_interpreter(path):
    pre = {"small": "", "tiled": TILED + "moe_triton.TMA = False\n", "tiled_tma": TILED}[path]
    r = interpreted(pre + SCRIPT)
    assert r["shape"] == [21, 80]
    assert r["counts"][2] == 21 > r["block_m"] and r["counts"][7] == 0 and r["counts"][1] == 0   # the cases meant
    assert r["err"] <= 1e-5 * r["scale"] and r["res_err"] <= 1e-5 * (r["scale"] + 5), r


ROUTE = r"""
import torch
from models.components.moe import SparseMoE
from models.components.moe_ops import fused_route

torch.manual_seed(0)
out = {}
for norm in (True, False):
    moe = SparseMoE(24, 16, 100, 6, norm)             # 100 experts: not a power of two (the kernel masks)
    x = torch.randn(9, 24)
    with torch.no_grad():
        logits = moe.gate(x)
        want_e, want_w = moe.route(x)                 # the torch path (fp32 here: the knob acts on bf16 only)
        got_e, got_w = fused_route(logits, 6, norm)
    out[str(norm)] = {"experts_equal": torch.equal(got_e, want_e), "w_err": (got_w - want_w).abs().max().item(),
                      "dtypes": [str(got_e.dtype), str(got_w.dtype)], "shape": list(got_w.shape)}
# ties, worked by hand: logits 0, 3, 1, 3, 2, 3 (three experts share the largest); top 4 takes experts 1, 3
# and 5 (the tied ones, lowest first), then 4; their softmax weights e^3, e^3, e^3, e^2 renormalised
ties = torch.tensor([[0.0, 3.0, 1.0, 3.0, 2.0, 3.0]])
e, w = fused_route(ties, 4, True)
out["ties"] = {"experts": e.tolist(), "weights": w.tolist()}
print(json.dumps(out))
"""


def test_the_fused_router_equals_the_torch_path_in_the_interpreter():
    import math

    r = interpreted(ROUTE)
    for norm in ("True", "False"):
        assert r[norm]["experts_equal"] and r[norm]["w_err"] <= 1e-6, r[norm]
        assert r[norm]["dtypes"] == ["torch.int64", "torch.float32"] and r[norm]["shape"] == [9, 6]
    assert r["ties"]["experts"] == [[1, 3, 5, 4]]
    z = 3 * math.e ** 3 + math.e ** 2
    assert r["ties"]["weights"][0] == pytest.approx([math.e ** 3 / z] * 3 + [math.e ** 2 / z], rel=1e-6)


# the counting sort of many pairs (moe_count, moe_place) against torch's stable sort, an independent order:
# blocks of 16 pairs compared 8 at a time, at most 4 blocks (so 200 pairs take blocks of 64), experts not a
# power of two, some chosen by no pair, one by most
GROUPING = r"""
import torch
from models.components import moe_ops, moe_sort, moe_triton

moe_sort.COUNT_BLOCK, moe_sort.COUNT_BLOCKS, moe_triton.COUNT_SUB = 16, 4, 8
E = 12
g = torch.Generator().manual_seed(3)
out = []
for p in (1, 16, 37, 64, 200):
    ex = torch.randint(0, 9, (p,), generator=g)            # experts 9..11: none
    ex[torch.rand(p, generator=g) < 0.4] = 4               # expert 4: about 40% of the pairs
    block, nb = moe_sort.count_blocks(p)
    counts = torch.full((nb, E), -7, dtype=torch.int32)
    rows = torch.full((p,), -7, dtype=torch.int32)
    ends = torch.full((E,), -7, dtype=torch.int32)
    moe_ops.moe_count(ex, counts)
    moe_ops.moe_place(ex, counts, rows, ends)
    want_rows = torch.sort(ex, stable=True).indices.to(torch.int32)
    want_ends = torch.bincount(ex, minlength=E).cumsum(0).to(torch.int32)
    out.append({"p": p, "block": block, "blocks": nb, "rows": torch.equal(rows, want_rows),
                "ends": torch.equal(ends, want_ends)})
print(json.dumps(out))
"""


def test_the_counting_sort_groups_pairs_as_a_stable_sort_in_the_interpreter():
    r = interpreted(GROUPING)
    assert [(c["p"], c["block"], c["blocks"]) for c in r] == [(1, 16, 1), (16, 16, 1), (37, 16, 3), (64, 16, 4),
                                                               (200, 64, 4)]
    assert all(c["rows"] and c["ends"] for c in r), r


def test_tma_descriptors_only_where_the_weights_take_them(monkeypatch):
    """The tiled kernels read weights through TMA descriptors where rows are contiguous and 16-byte aligned
    (a CPU tensor stands for a GPU that has TMA: the interpreter runs the descriptors); else by pointers."""
    import torch
    from models.components import moe_triton

    w = torch.empty(4, 8, 16, dtype=torch.bfloat16)                 # rows of 32 bytes
    assert moe_triton._tma(w)
    assert not moe_triton._tma(w[:, ::2])                            # rows of 32 bytes, not contiguous
    assert not moe_triton._tma(torch.empty(4, 8, 4, dtype=torch.bfloat16))   # rows of 8 bytes
    monkeypatch.setattr(moe_triton, "TMA", False)
    assert not moe_triton._tma(w)
