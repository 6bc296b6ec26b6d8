"""What the SM90 MoE path (models/components/moe_sm90.py) needs beside FlashInfer's kernels, on CPU: the padded
tiles' maps moe_place_tiles writes (under Triton's interpreter, against maps worked out by torch's stable sort),
the interleaved rows of gate_up_proj (Experts.arrange_weights: by hand, and every path of Experts reading them to
the same result), and the scaled sum that follows the kernels' unscaled down rows (moe_sum_add with weights).
The kernels themselves run on the GPU only: tests/gpu/test_moe_sm90_gpu.py."""
import pytest
import torch

from tests.unit.test_moe_triton import interpreted

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

# expert 4 takes about 40% of the pairs (several tiles), experts 9..11 none, 16-row tiles; the maps worked out
# from torch's stable sort: each expert's pairs from the next multiple of 16 on
MAPS = r"""
import torch
from models.components import moe_ops, moe_sort, moe_triton

moe_sort.COUNT_BLOCK, moe_sort.COUNT_BLOCKS, moe_triton.COUNT_SUB = 16, 4, 8
moe_triton.TILES_BLOCK = 8
E, TILE = 12, 16
g = torch.Generator().manual_seed(5)
out = []
for p in (13, 37, 200):
    ex = torch.randint(0, 9, (p,), generator=g)
    ex[torch.rand(p, generator=g) < 0.4] = 4
    n = (p + (TILE - 1) * E) // TILE if p > E else p
    counts = torch.full((moe_sort.count_blocks(p)[1], E), -7, dtype=torch.int32)
    rows = torch.full((n * TILE,), -7, dtype=torch.int32)
    tiles = torch.full((2 * n + 1,), -7, dtype=torch.int32)
    moe_ops.moe_count(ex, counts)
    moe_ops.moe_place_tiles(ex, counts, rows, tiles, TILE)
    order = torch.sort(ex, stable=True).indices
    want_rows = torch.full((n * TILE,), -7, dtype=torch.int32)
    want_exp, want_lim = [], []
    start = 0
    for e in range(E):
        mine = order[ex[order] == e]
        want_rows[start:start + len(mine)] = mine.to(torch.int32)
        k = -(-len(mine) // TILE)
        want_exp += [e] * k
        want_lim += [start + len(mine)] * k
        start += k * TILE
    used = len(want_exp)
    want_exp += [0] * (n - used)
    want_lim += [0] * (n - used)
    out.append({"p": p, "n": n, "used": used, "rows": torch.equal(rows, want_rows),
                "experts": tiles[:n].tolist() == want_exp, "limits": tiles[n:2 * n].tolist() == want_lim,
                "count": int(tiles[2 * n])})
print(json.dumps(out))
"""


def test_place_tiles_pads_each_experts_pairs_to_whole_tiles_in_the_interpreter():
    r = interpreted(MAPS)
    assert [c["p"] for c in r] == [13, 37, 200]
    for c in r:
        assert c["rows"] and c["experts"] and c["limits"] and c["count"] == c["used"], c
    assert r[2]["n"] > 8 and r[2]["used"] > 1        # more tiles than one block of the map's loop; several used


def test_interleave_by_hand():
    from models.components import moe_sm90

    inter, hidden = 64, 3
    w = torch.arange(2 * inter * hidden, dtype=torch.float32).reshape(2 * inter, hidden)   # gate rows 0..63, up 64..127
    got = moe_sm90.interleave(w, 32)
    rows = [int(r) for r in got[:, 0] // hidden]
    assert rows == list(range(64, 96)) + list(range(0, 32)) + list(range(96, 128)) + list(range(32, 64))
    assert torch.equal(moe_sm90.interleave(got, 0), w)


LAYOUT = r"""
import torch
from models.components.moe import Experts
from models.components.moe_ops import fused_experts
from models.components import moe_ops, moe_triton

torch.manual_seed(0)
E, H, I, T, K = 6, 40, 64, 21, 3
ex = Experts(E, H, I)
torch.nn.init.normal_(ex.gate_up_proj, std=0.2)
torch.nn.init.normal_(ex.down_proj, std=0.2)
x = torch.randn(T, H)
experts = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
weights = torch.rand(T, K)
before = ex.gate_up_proj.detach().clone()
with torch.no_grad():
    want = ex(x, experts, weights)                                     # gate then up, torch's path
    ex.moe_sm90_from = 4096                                            # the knob, as boot sets it
    ex.arrange_weights()
    moved = not torch.equal(ex.gate_up_proj, before)
    torch_path = ex(x, experts, weights)                               # interleaved, torch's path
    small = fused_experts(x, ex.gate_up_proj, ex.down_proj, experts, weights, interleave=ex.gate_up_layout)
    moe_triton.TILED_FROM = moe_ops.GROUP_SORT_FROM = 0
    moe_triton.TILED = {"gate_up": (16, 32, 32, 4, 3), "down": (16, 32, 32, 4, 3)}
    tiled = fused_experts(x, ex.gate_up_proj, ex.down_proj, experts, weights, interleave=ex.gate_up_layout)
    ex.moe_sm90_from = 0
    ex.arrange_weights()
    back = torch.equal(ex.gate_up_proj, before) and ex.gate_up_layout == 0
err = lambda y: (y - want).abs().max().item()
print(json.dumps({"moved": moved, "torch": err(torch_path), "small": err(small), "tiled": err(tiled), "back": back,
                  "scale": want.abs().max().item()}))
"""


def test_every_experts_path_reads_the_interleaved_rows_in_the_interpreter():
    r = interpreted(LAYOUT)
    assert r["moved"] and r["back"], r
    assert max(r["torch"], r["small"], r["tiled"]) <= 1e-5 * r["scale"], r


SUM = r"""
import torch
from models.components.moe_ops import moe_sum_add

g = torch.Generator().manual_seed(2)
T, K, H = 5, 3, 1100                                   # past one 1,024-column block
pairs = torch.randn(T, K, H, generator=g)
w = torch.rand(T, K, generator=g)
res = torch.randn(T, 2 * H, generator=g)[:, 7:7 + H]   # rows strided
want = (pairs * w[..., None]).sum(1)
y1, y2 = torch.empty(T, H), torch.empty(T, H)
moe_sum_add(pairs, None, y1, w)
moe_sum_add(pairs, res, y2, w)
print(json.dumps({"plain": (y1 - want).abs().max().item(), "residual": (y2 - (want + res)).abs().max().item()}))
"""


def test_the_scaled_sum_in_the_interpreter():
    r = interpreted(SUM)
    assert r["plain"] <= 1e-5 and r["residual"] <= 1e-5, r


def test_arrange_weights_in_process():
    """Experts.arrange_weights on the CPU (fp32, torch's path; intermediate 64: two interleaved blocks of 32): the
    rows move as moe_sm90.interleave lays them, the forward reads them to the same output, and the knob's reset
    lays them back bit for bit; an intermediate size that is not a multiple of 32 is refused by name."""
    from models.components import moe_sm90
    from models.components.moe import Experts

    torch.manual_seed(0)
    ex = Experts(4, 64, 64)
    torch.nn.init.normal_(ex.gate_up_proj, std=0.2)
    torch.nn.init.normal_(ex.down_proj, std=0.2)
    x, weights = torch.randn(6, 64), torch.rand(6, 2)
    experts = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2], [1, 3]])
    before = ex.gate_up_proj.detach().clone()
    with torch.no_grad():
        want = ex(x, experts, weights)
        ex.moe_sm90_from = 2048
        ex.arrange_weights()
        assert ex.gate_up_layout == moe_sm90.INTERLEAVE
        assert torch.equal(ex.gate_up_proj, torch.stack([moe_sm90.interleave(w, 32) for w in before]))
        torch.testing.assert_close(ex(x, experts, weights), want, rtol=1e-6, atol=1e-6)
        ex.moe_sm90_from = 0
        ex.arrange_weights()
    assert ex.gate_up_layout == 0 and torch.equal(ex.gate_up_proj, before)

    odd = Experts(4, 64, 48)                     # 2 x 48 rows: not whole blocks of 2 x 32
    odd.moe_sm90_from = 2048
    with pytest.raises(ValueError, match="intermediate size 48 is not a multiple of 32"):
        odd.arrange_weights()
