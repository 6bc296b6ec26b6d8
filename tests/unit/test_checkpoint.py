"""The checkpoint loader: per-expert tensors fuse, q/k/v and gate/up stack, as do a module's own STACKS;
missing, unexpected and mis-shaped are named."""
import pytest
import torch
from safetensors.torch import save_file

from graphc.errors import InvalidInput
from graphc.runtime.checkpoint import load_weights


class Experts(torch.nn.Module):
    def __init__(self, e=3, h=4, i=2):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.zeros(e, 2 * i, h))
        self.down_proj = torch.nn.Parameter(torch.zeros(e, h, i))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.Linear(4, 4, bias=False)
        self.mlp = torch.nn.Module()
        self.mlp.experts = Experts()


def per_expert(prefix="m."):
    torch.manual_seed(0)
    t = {f"{prefix}norm.weight": torch.randn(4, 4)}
    for e in range(3):
        for n, shape in (("gate_proj", (2, 4)), ("up_proj", (2, 4)), ("down_proj", (4, 2))):
            t[f"{prefix}mlp.experts.{e}.{n}.weight"] = torch.randn(*shape)
    return t


def test_per_expert_tensors_fuse_gate_then_up(tmp_path):
    t = per_expert()
    save_file(t, tmp_path / "model.safetensors")
    b = Block()
    rep = load_weights(b, tmp_path, prefix="m.")
    assert rep.fused == 2 and rep.loaded == 3
    assert torch.equal(b.mlp.experts.gate_up_proj[1], torch.cat([t["m.mlp.experts.1.gate_proj.weight"],
                                                                  t["m.mlp.experts.1.up_proj.weight"]]))
    assert torch.equal(b.mlp.experts.down_proj[2], t["m.mlp.experts.2.down_proj.weight"])


def test_fused_tensors_load_as_they_are(tmp_path):
    b = Block()
    fused = {k: torch.randn_like(v) for k, v in b.state_dict().items()}
    save_file(fused, tmp_path / "a.safetensors")
    load_weights(b, tmp_path / "a.safetensors")
    assert torch.equal(b.mlp.experts.down_proj, fused["mlp.experts.down_proj"])


def test_shards_through_the_index(tmp_path):
    import json

    t = per_expert()
    first = {k: v for k, v in t.items() if "experts.2" not in k}
    second = {k: v for k, v in t.items() if "experts.2" in k}
    save_file(first, tmp_path / "model-00001-of-00002.safetensors")
    save_file(second, tmp_path / "model-00002-of-00002.safetensors")
    index = {"weight_map": {**{k: "model-00001-of-00002.safetensors" for k in first},
                            **{k: "model-00002-of-00002.safetensors" for k in second}}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert load_weights(Block(), tmp_path, prefix="m.").fused == 2


def test_missing_unexpected_and_misshaped_are_named(tmp_path):
    t = per_expert()
    del t["m.mlp.experts.1.up_proj.weight"]
    t["m.norm.weight"] = torch.randn(4, 5)
    t["m.extra.bias"] = torch.randn(3)
    save_file(t, tmp_path / "model.safetensors")
    with pytest.raises(InvalidInput) as e:
        load_weights(Block(), tmp_path, prefix="m.")
    msg = str(e.value)
    assert "m.norm.weight: on disk [4, 5], module wants [4, 4]" in msg
    assert "m.mlp.experts.gate_up_proj: missing (nor per-expert m.mlp.experts.1.up_proj.weight)" in msg
    assert "unexpected: m.extra.bias" in msg


def test_no_checkpoint(tmp_path):
    with pytest.raises(InvalidInput, match="no .safetensors files"):
        load_weights(Block(), tmp_path)


class Dense(torch.nn.Module):
    """Attention and a SwiGLU as the layers hold them: q/k/v and gate/up stacked, one with biases."""

    def __init__(self):
        super().__init__()
        self.self_attn = torch.nn.Module()
        self.self_attn.qkv_proj = torch.nn.Linear(4, 6 + 2 + 2, bias=False)
        self.mlp = torch.nn.Module()
        self.mlp.gate_up_proj = torch.nn.Linear(4, 2 * 3, bias=True)


def dense_disk(prefix="m."):
    torch.manual_seed(1)
    return {f"{prefix}self_attn.q_proj.weight": torch.randn(6, 4), f"{prefix}self_attn.k_proj.weight": torch.randn(2, 4),
            f"{prefix}self_attn.v_proj.weight": torch.randn(2, 4), f"{prefix}mlp.gate_proj.weight": torch.randn(3, 4),
            f"{prefix}mlp.up_proj.weight": torch.randn(3, 4), f"{prefix}mlp.gate_proj.bias": torch.randn(3),
            f"{prefix}mlp.up_proj.bias": torch.randn(3)}


def test_dense_projections_stack_in_order(tmp_path):
    t = dense_disk()
    save_file(t, tmp_path / "model.safetensors")
    d = Dense()
    rep = load_weights(d, tmp_path, prefix="m.")
    assert rep.loaded == 3 and rep.fused == 3 and len(rep.used) == 7
    w = d.self_attn.qkv_proj.weight
    # by hand: rows 0-5 q's, 6-7 k's, 8-9 v's; gate's rows (and bias) before up's
    assert torch.equal(w[:6], t["m.self_attn.q_proj.weight"]) and torch.equal(w[6:8], t["m.self_attn.k_proj.weight"])
    assert torch.equal(w[8:], t["m.self_attn.v_proj.weight"])
    assert torch.equal(d.mlp.gate_up_proj.weight[3:], t["m.mlp.up_proj.weight"])
    assert torch.equal(d.mlp.gate_up_proj.bias[:3], t["m.mlp.gate_proj.bias"])


def test_stacked_tensors_load_as_they_are(tmp_path):
    d = Dense()
    stacked = {k: torch.randn_like(v) for k, v in d.state_dict().items()}
    save_file(stacked, tmp_path / "a.safetensors")
    assert load_weights(d, tmp_path / "a.safetensors").fused == 0
    assert torch.equal(d.self_attn.qkv_proj.weight, stacked["self_attn.qkv_proj.weight"])


def test_a_missing_or_misshaped_part_is_named(tmp_path):
    t = dense_disk()
    del t["m.self_attn.k_proj.weight"]
    t["m.mlp.up_proj.weight"] = torch.randn(4, 4)
    save_file(t, tmp_path / "model.safetensors")
    with pytest.raises(InvalidInput) as e:
        load_weights(Dense(), tmp_path, prefix="m.")
    msg = str(e.value)
    assert "m.self_attn.qkv_proj.weight: missing (nor m.self_attn.k_proj.weight)" in msg
    assert ("m.mlp.gate_up_proj.weight: m.mlp.gate_proj.weight + m.mlp.up_proj.weight stack to [7, 4], "
            "module wants [6, 4]") in msg


def test_a_large_tensor_goes_in_by_row_chunks_cast_on_the_way(tmp_path, monkeypatch):
    """The host never holds more than STAGING_BYTES of a tensor: with a 4 KiB chunk, a 64 KiB fp32 matrix (and
    its bf16 cast) arrives 16 rows at a time, every row in place; a scalar arrives whole."""
    from graphc.runtime import checkpoint

    monkeypatch.setattr(checkpoint.hostmem, "STAGING_BYTES", 4096)
    big = torch.randn(256, 64)              # a row: 64 x 4 B as read (fp32, wider than bf16): 16 rows a 4 KiB chunk
    save_file({"w": big, "s": torch.tensor(2.5)}, tmp_path / "a.safetensors")
    m = torch.nn.Module()
    m.w = torch.nn.Parameter(torch.zeros(256, 64, dtype=torch.bfloat16))
    m.s = torch.nn.Parameter(torch.zeros(()))
    reads = []
    real = checkpoint.Shards.rows
    monkeypatch.setattr(checkpoint.Shards, "rows", lambda self, n, a, b: reads.append((n, a, b)) or real(self, n, a, b))
    load_weights(m, tmp_path)
    assert [r for r in reads if r[0] == "w"] == [("w", r, r + 16) for r in range(0, 256, 16)]
    assert torch.equal(m.w, big.to(torch.bfloat16)) and m.s.item() == 2.5


class Mixer(torch.nn.Module):
    """A submodule that holds three disk projections as one matrix (as GatedDeltaNet does)."""

    STACKS = {"in_abc": ("in_a", "in_b", "in_c")}

    def __init__(self):
        super().__init__()
        self.in_abc = torch.nn.Linear(4, 2 + 3 + 1, bias=False)


def test_a_submodules_own_stacks_load_its_parts_in_order(tmp_path):
    """A module's STACKS (here a submodule's, under a plain parent) stacks its parts' rows in the order it names:
    rows 0-1 in_a's, 2-4 in_b's, 5 in_c's; a missing part is refused by its disk name."""
    torch.manual_seed(0)
    t = {"m.layer.in_a.weight": torch.randn(2, 4), "m.layer.in_b.weight": torch.randn(3, 4),
         "m.layer.in_c.weight": torch.randn(1, 4)}
    save_file(t, tmp_path / "model.safetensors")
    parent = torch.nn.Module()
    parent.layer = Mixer()
    rep = load_weights(parent, tmp_path, prefix="m.")
    assert rep.fused == 1 and rep.loaded == 1
    w = parent.layer.in_abc.weight
    assert torch.equal(w[:2], t["m.layer.in_a.weight"]) and torch.equal(w[2:5], t["m.layer.in_b.weight"])
    assert torch.equal(w[5:], t["m.layer.in_c.weight"])
    del t["m.layer.in_b.weight"]
    save_file(t, tmp_path / "model.safetensors")
    with pytest.raises(InvalidInput) as e:
        load_weights(parent, tmp_path, prefix="m.")
    assert "m.layer.in_abc.weight: missing (nor m.layer.in_b.weight)" in str(e.value)
