"""A tensor-parallel rank's view of a checkpoint (graphc/runtime/checkpoint.py RankShards, load_weights(rank, tp),
graphc.Split): each expected part is written out by hand as the rows, columns or index lists it must hold, from
safetensors files and from tensors in memory alike."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from graphc import NodeModule, Split
from graphc.errors import InvalidInput
from graphc.runtime import checkpoint
from graphc.runtime.checkpoint import RankShards, Shards, TensorShards, load_weights


def numbered(*shape: int) -> torch.Tensor:
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).view(shape)


TENSORS = {"rows": numbered(6, 4), "cols": numbered(4, 6), "blocks": numbered(8, 2), "fused": numbered(2, 4, 3),
           "last": numbered(2, 3, 4), "whole": numbered(3, 2), "scalar": torch.tensor(7.0)}
SPLITS = [Split("rows", 0), Split("cols", 1), Split("blocks", 0, (2, 2, 4)), Split("fused", 1, (2, 2)),
          Split("last", 2)]


@pytest.fixture(params=["file", "memory"])
def source(request, tmp_path) -> Shards:
    if request.param == "memory":
        return TensorShards(TENSORS)
    save_file(TENSORS, tmp_path / "a.safetensors")
    return Shards(tmp_path / "a.safetensors")


def whole_part(view: Shards, name: str) -> torch.Tensor:
    return view.rows(name, 0, view.shape(name)[0])


def test_rank_parts_of_rows_columns_blocks_and_3d_tensors(source):
    """tp 2. rows [6, 4] on dim 0: rank 1 rows 3..5; cols [4, 6] on dim 1: rank 0 columns 0..2; blocks [8, 2]
    of (2, 2, 4): rank 1 rows 1, 3, 6, 7; fused [2, 4, 3] of (2, 2) on dim 1: rank 1 rows 1 and 3 of each
    expert; last [2, 3, 4] on dim 2: rank 0 columns 0, 1. whole and scalar: no Split, themselves."""
    r0, r1 = RankShards(source, SPLITS, 0, 2), RankShards(source, SPLITS, 1, 2)
    t = TENSORS
    assert r1.shape("rows") == (3, 4) and torch.equal(whole_part(r1, "rows"), t["rows"][3:6])
    assert torch.equal(r1.rows("rows", 1, 2), t["rows"][4:5])
    assert r0.shape("cols") == (4, 3) and torch.equal(r0.rows("cols", 1, 3), t["cols"][1:3, 0:3])
    assert torch.equal(whole_part(r1, "cols"), t["cols"][:, 3:6])
    assert r1.shape("blocks") == (4, 2) and torch.equal(whole_part(r1, "blocks"), t["blocks"][[1, 3, 6, 7]])
    assert torch.equal(r1.rows("blocks", 1, 3), t["blocks"][[3, 6]])
    assert torch.equal(whole_part(r0, "blocks"), t["blocks"][[0, 2, 4, 5]])
    assert r1.shape("fused") == (2, 2, 3) and torch.equal(whole_part(r1, "fused"), t["fused"][:, [1, 3]])
    assert torch.equal(r1.rows("fused", 1, 2), t["fused"][1:2, [1, 3]])
    assert r0.shape("last") == (2, 3, 2) and torch.equal(whole_part(r0, "last"), t["last"][:, :, 0:2])
    assert r1.shape("whole") == (3, 2) and torch.equal(whole_part(r1, "whole"), t["whole"])
    assert r1.shape("scalar") == () and r1.rows("scalar", 0, 1).item() == 7.0


def test_patterns_match_the_name_after_the_prefix(source):
    """A Split's pattern is fullmatched against the name after the node's prefix: 'ows' matches nothing."""
    view = RankShards(TensorShards({"n.rows": TENSORS["rows"]}), [Split("rows", 0)], 1, 2, prefix="n.")
    assert torch.equal(whole_part(view, "n.rows"), TENSORS["rows"][3:6])
    assert RankShards(source, [Split("ows", 0)], 1, 2).shape("rows") == (6, 4)


class Tiny(NodeModule):
    """q/k/v stacked into qkv_proj, per-expert tensors fused: the loader's stacking on top of a rank's parts."""

    def __init__(self, heads: int, experts: int = 2):
        super().__init__()
        self.attn = torch.nn.Module()
        self.attn.qkv_proj = torch.nn.Linear(4, 3 * 2 * heads, bias=False)     # q, k, v: heads of 2 rows
        self.attn.o_proj = torch.nn.Linear(2 * heads, 4, bias=False)
        self.experts = torch.nn.Module()
        self.experts.gate_up_proj = torch.nn.Parameter(torch.zeros(experts, 2 * heads, 4))
        self.norm = torch.nn.Parameter(torch.zeros(4))

    def tp_splits(self) -> list[Split]:
        return [Split(r"attn\.[qkv]_proj\.weight", 0), Split(r"attn\.o_proj\.weight", 1),
                Split(r"experts\.\d+\.(gate|up)_proj\.weight", 0)]


def tiny_checkpoint(prefix: str = "m.") -> dict[str, torch.Tensor]:
    t = {f"{prefix}attn.{p}_proj.weight": numbered(4, 4) + 100 * i for i, p in enumerate("qkv")}
    t[f"{prefix}attn.o_proj.weight"] = numbered(4, 4) + 300
    for e in range(2):
        t[f"{prefix}experts.{e}.gate_proj.weight"] = numbered(2, 4) + 400 + 10 * e
        t[f"{prefix}experts.{e}.up_proj.weight"] = numbered(2, 4) + 500 + 10 * e
    t[f"{prefix}norm"] = numbered(4)
    return t


@pytest.mark.parametrize("on_disk", [True, False], ids=["file", "memory"])
def test_load_weights_stacks_and_fuses_a_ranks_parts(tmp_path, on_disk):
    """Rank 1 of 2 (2 heads of 2 rows each whole): qkv_proj = q rows 2, 3; k rows 2, 3; v rows 2, 3; o_proj
    columns 2, 3; each expert's gate_up = its gate row 1, up row 1; the norm whole. Rank 0 the other halves."""
    t = tiny_checkpoint()
    if on_disk:
        save_file(t, tmp_path / "a.safetensors")
    src = tmp_path if on_disk else TensorShards(t)
    for rank, rows in ((0, slice(0, 2)), (1, slice(2, 4))):
        m = Tiny(heads=1)
        load_weights(m, src, prefix="m.", rank=rank, tp=2)
        want = torch.cat([t[f"m.attn.{p}_proj.weight"][rows] for p in "qkv"])
        assert torch.equal(m.attn.qkv_proj.weight, want)
        assert torch.equal(m.attn.o_proj.weight, t["m.attn.o_proj.weight"][:, rows])
        e = rows.start // 2
        assert torch.equal(m.experts.gate_up_proj[1], torch.cat([t["m.experts.1.gate_proj.weight"][e:e + 1],
                                                                 t["m.experts.1.up_proj.weight"][e:e + 1]]))
        assert torch.equal(m.norm, t["m.norm"])


def test_tp_1_and_a_module_without_splits_load_whole():
    t = tiny_checkpoint()
    whole = Tiny(heads=2)
    load_weights(whole, TensorShards(t), prefix="m.", rank=0, tp=1)
    assert torch.equal(whole.attn.o_proj.weight, t["m.attn.o_proj.weight"])
    plain = torch.nn.Module()                          # not a NodeModule: no splits, every tensor whole
    plain.norm = torch.nn.Parameter(torch.zeros(4))
    load_weights(plain, TensorShards({"norm": numbered(4)}), rank=1, tp=2)
    assert torch.equal(plain.norm, numbered(4))


def test_a_column_split_reads_row_chunks_of_its_columns(tmp_path, monkeypatch):
    """STAGING_BYTES 4 KiB, a [256, 64] fp32 matrix cut on dim 1 by 2: a rank's row is 32 x 4 B, so it reads
    [32, 32] blocks (4 KiB), 8 of them, each of its columns only; a dim-0 split of blocks reads at most a chunk
    of rows at a time too."""
    monkeypatch.setattr(checkpoint.hostmem, "STAGING_BYTES", 4096)
    big = numbered(256, 64)
    save_file({"w": big, "b": numbered(256, 64)}, tmp_path / "a.safetensors")
    reads = []
    real_part, real_rows = Shards.part, Shards.rows
    monkeypatch.setattr(Shards, "part", lambda self, n, i: reads.append(tuple(real_part(self, n, i).shape))
                        or real_part(self, n, i))
    monkeypatch.setattr(Shards, "rows", lambda self, n, a, b: reads.append((b - a, 64)) or real_rows(self, n, a, b))
    m = Model2()
    load_weights(m, tmp_path, rank=1, tp=2)
    assert reads.count((32, 32)) == 8 and torch.equal(m.w, big[:, 32:])
    assert all(r[0] * r[1] * 4 <= 4096 for r in reads), reads
    assert torch.equal(m.b, torch.cat([big[32:64], big[96:128], big[192:256]]))


class Model2(NodeModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(256, 32))
        self.b = torch.nn.Parameter(torch.zeros(128, 64))

    def tp_splits(self) -> list[Split]:
        return [Split("w", 1), Split("b", 0, (64, 64, 128))]


@pytest.mark.parametrize("splits, message", [
    ([Split("rows", 0, (2, 2))], r"rows: dim 0 of shape \[6, 4\] cannot be cut in 2 parts: its blocks \[2, 2\] sum "
                                 r"to 4, not the axis' length 6"),
    ([Split("whole", 0)], r"whole: dim 0 of shape \[3, 2\] cannot be cut in 2 parts: tp 2 does not divide its "
                          r"length \[3\]"),
    ([Split("blocks", 0, (3, 1, 4))], r"tp 2 does not divide its lengths \[3, 1, 4\]"),
    ([Split("rows", 2)], r"rows: a tensor-parallel split on dim 2 of a tensor of shape \[6, 4\]"),
    ([Split("rows", 0), Split("r.ws", 1)], "rows: 2 tensor-parallel splits match it"),
], ids=["blocks-sum", "indivisible", "indivisible-block", "no-such-dim", "two-match"])
def test_a_split_that_cannot_cut_its_tensor_is_refused_before_a_read(source, splits, message):
    with pytest.raises(InvalidInput, match=message):
        RankShards(source, splits, 0, 2)


@pytest.mark.parametrize("rank, tp", [(2, 2), (-1, 2), (0, 0)])
def test_a_rank_outside_tp_is_refused(source, rank, tp):
    with pytest.raises(InvalidInput, match="tensor-parallel rank"):
        RankShards(source, SPLITS, rank, tp)


@pytest.mark.parametrize("kw, error", [(dict(pattern="a", dim=-1), ValueError),
                                        (dict(pattern="a", dim=0, blocks=(2, 0)), ValueError),
                                        (dict(pattern="a", dim=0, blocks=[2, 2]), ValueError),
                                        (dict(pattern="(", dim=0), Exception), (dict(pattern=1, dim=0), TypeError),
                                        (dict(pattern="a", dim=0, block=(2,)), TypeError)])
def test_a_malformed_split_is_refused(kw, error):
    with pytest.raises(error):
        Split(**kw)
