"""Float workspaces and wrapper buffers (graphc/passes/size_resources.py), and weight sizes
(graphc/passes/size_weights.py), on small models whose needs are worked out by hand.

A workspace must hold its users' largest need: FlashInfer's split-KV partials of the fa2 backend
at every step that calls the resource, i.e. every captured graph at its family's step and every rung
of a walk that runs eagerly. fa3 and torch keep none. A declared workspace smaller than that is
refused with the numbers and the fix; a compiler-sized one is the need rounded up to 1 MiB (at
least 1 MiB on a GPU, where FlashInfer's wrappers take one anyway; nothing on the cpu), in every slot.
"""
from __future__ import annotations

import re

import pytest

import graphc as gc
from graphc.errors import InvalidInput
from graphc.pipeline import run_passes
from graphc.targets import get_target
from graphc.units import MiB, fmt_bytes
from resources import PagedKVSpec, RaggedAttentionSpec, WorkspaceSpec
from tests.remedies_model import blob_node, dec_node, enc_node

H100_SMS = 132


def fa2_ragged_need(windows: int, heads: int = 2, head_dim: int = 64, sms: int = H100_SMS) -> int:
    """FlashInfer's captured fa2 prefill partials for `windows` segments of 16 rows, no GQA:
    the query tile is 16, 64 or 128 rows by the longest packed query (rows - segments + 1); tiles
    = ceil(rows / tile) + segments - 1, padded up to the split bound 2 CTAs x SMs / kv heads; the
    partials hold tile rows per padded tile of every head, head_dim fp32 values and one fp32 score."""
    rows, segments = 16 * windows, windows
    longest = rows - segments + 1
    tile = 128 if longest > 64 else 64 if longest > 16 else 16
    padded = max(2 * sms // heads, -(-rows // tile) + segments - 1)
    return heads * padded * tile * (head_dim + 1) * 4


# pinned by hand: 1 window runs 16-row tiles, 2..4 run 64, from 5 on 128; the split bound (132 tiles)
# holds up to 117 windows (ceil(16 w / 128) + w - 1 <= 132), 128 windows take 16 + 127 = 143 tiles
assert fa2_ragged_need(1) == 2 * 132 * 16 * 65 * 4 == 1_098_240
assert fa2_ragged_need(4) == 2 * 132 * 64 * 65 * 4
assert fa2_ragged_need(8) == fa2_ragged_need(32) == 2 * 132 * 128 * 65 * 4 == 8_785_920
assert fa2_ragged_need(128) == 2 * 143 * 128 * 65 * 4 == 9_518_080
assert fa2_ragged_need(256) == 2 * (32 + 255) * 128 * 65 * 4 == 19_102_720


def ragged(name: str, workspace: str | None = None, backend: str = "fa2") -> RaggedAttentionSpec:
    return RaggedAttentionSpec(name=name, num_heads=2, head_dim=64, max_segment=16, rows_per_segment=16,
                               backend=backend, workspace=workspace)


def sizes(model: gc.Model, gpu: str = "h100"):
    return run_passes(model, get_target(gpu), 1, 0).sizing


def two_encoders(enc_ws: str | None = None, other_ws: str | None = None, extra: tuple = ()) -> gc.Model:
    """enc (resource attn): walk a captures [64, 128] windows; walk b runs eagerly above 2 windows,
    with rungs 1 2 4 8. other (resource attn_o): walk c is not captured (256 windows, every rung
    eager); walk d captures [1, 2]. attn's largest need is enc's captured 128 windows; attn_o's is
    other's eager 256 windows."""
    return gc.Model(
        name="encoders",
        nodes=[enc_node("enc", resources={"attn": "attn"}), enc_node("other", resources={"attn": "attn_o"})],
        resources=[*extra, ragged("attn", enc_ws), ragged("attn_o", other_ws)],
        walks=[gc.Walk(name="a", kind="prefill", path=("enc",), ladder=(64,), budget=gc.Budget(windows=128)),
               gc.Walk(name="b", kind="prefill", path=("enc",), capture_limit={"enc": 2}, budget=gc.Budget(windows=8)),
               gc.Walk(name="c", kind="prefill", path=("other",), capture=False, budget=gc.Budget(windows=256)),
               gc.Walk(name="d", kind="prefill", path=("other",), budget=gc.Budget(windows=2))])


def test_need_is_the_largest_at_captured_rungs_and_eager_steps_of_its_own_nodes():
    s = sizes(two_encoders())
    ws = s.resources.workspaces
    assert ws["attn"].need.bytes == fa2_ragged_need(128)         # captured; b's eager rungs need less
    assert ws["attn_o"].need.bytes == fa2_ragged_need(256)       # eager; d's captured rungs need less
    # compiler-sized, undeclared: the need rounded up to whole MiB
    assert (ws["attn"].bytes, ws["attn_o"].bytes) == (10 * MiB, 19 * MiB)
    assert not ws["attn"].declared and ws["attn"].users == ("attn",)


def test_paged_need_at_the_family_step_and_at_decode():
    """prefill (4096 tokens, 4 seqs) and mixed (1024 tokens, 8 seqs) are one graph family, captured
    at its step: 4096 tokens of 8 sequences. fa2 prefill there, 8 heads of 128 on 8 kv heads:
    tiles = 4096 / 128 + 8 - 1 = 39 over a split bound of 2 x 132 / 8 = 33, so 39 x 128 rows of
    8 x (128 + 1) fp32. Decode: 16 blocks/SM x 132 / 8 = 264 rows, less."""
    model = gc.Model(
        name="paged", nodes=[dec_node(kv=(8, 128))],
        resources=[PagedKVSpec(name="kv", num_layers=2, num_qo_heads=8, num_kv_heads=8, head_dim=128, page_size=16,
                               max_seq_len=256, pages=64, backend="fa2", decode_backend="fa2")],
        walks=[gc.Walk(name="prefill", kind="prefill", path=("dec",), ladder=(1024,),
                       budget=gc.Budget(tokens=4096, seqs=4)),
               gc.Walk(name="mixed", kind="mixed", path=("dec",), ladder=(256,), budget=gc.Budget(tokens=1024, seqs=8)),
               gc.Walk(name="decode", kind="decode", path=("dec",), budget=gc.Budget(seqs=4))])
    ws = sizes(model).resources.workspaces["kv"]
    assert ws.need.bytes == 39 * 128 * 8 * 129 * 4 == 20_606_976
    assert ws.bytes == 20 * MiB
    decode_only = model.model_copy(update={"walks": model.walks[2:], "requests": ()})
    assert sizes(decode_only).resources.workspaces["kv"].need.bytes == 264 * 8 * 129 * 4


def test_a_shared_workspace_holds_its_largest_user_in_every_slot():
    """shared (compiler-sized, 2 slots) serves attn and attn_o: attn_o's 256-window need wins, 19 MiB
    a slot. fixed, declared after it, keeps its 32 MiB x 3 slots. Both are ledger lines of their own:
    'formula' for the compiler's, 'declared' for the declared one (so is the undeclared one of a
    resource that names none)."""
    base = two_encoders("shared", "shared", (WorkspaceSpec(name="shared", slots=2),
                                             WorkspaceSpec(name="fixed", bytes=32 * MiB, slots=3)))
    model = gc.Model(
        name="shared", resources=(*base.resources, ragged("attn_f", "fixed"), ragged("attn_self")),
        nodes=(*base.nodes, enc_node("third", resources={"attn": "attn_f"}),
               enc_node("fourth", resources={"attn": "attn_self"})),
        walks=(*base.walks, gc.Walk(name="e", kind="prefill", path=("third",), budget=gc.Budget(windows=1)),
               gc.Walk(name="f", kind="prefill", path=("fourth",), budget=gc.Budget(windows=1))))
    result = run_passes(model, get_target("h100"), 1, 0)
    ws = result.sizing.resources.workspaces
    assert ws["shared"].users == ("attn", "attn_o") and ws["shared"].need.bytes == fa2_ragged_need(256)
    assert (ws["shared"].bytes, ws["shared"].declared) == (2 * 19 * MiB, False)
    assert (ws["fixed"].bytes, ws["fixed"].declared) == (3 * 32 * MiB, True)
    assert ws["attn_self"].bytes == 2 * MiB and ws["attn_self"].need.bytes == fa2_ragged_need(1)
    items = {i.component: i for i in result.placement.devices[0].items}
    assert (items["workspace.shared"].bytes, items["workspace.shared"].source) == (38 * MiB, "formula")
    assert (items["workspace.fixed"].bytes, items["workspace.fixed"].source) == (96 * MiB, "declared")
    assert (items["workspace.attn_self"].bytes, items["workspace.attn_self"].source) == (2 * MiB, "formula")


def test_a_declared_workspace_is_checked_against_its_largest_user():
    """The need itself fits; one byte less is refused with both numbers, the step and the fix. With
    two users the larger one decides: 15 MiB holds attn's 9.1 MiB, not attn_o's 18.2 MiB."""
    need = fa2_ragged_need(128)
    ok = sizes(two_encoders("ws", extra=(WorkspaceSpec(name="ws", bytes=need, slots=2),)))
    assert (ok.resources.workspaces["ws"].bytes, ok.resources.workspaces["ws"].declared) == (2 * need, True)
    with pytest.raises(InvalidInput) as e:
        sizes(two_encoders("ws", extra=(WorkspaceSpec(name="ws", bytes=need - 1),)))
    text = str(e.value)
    assert f"workspace 'ws' holds {fmt_bytes(need - 1)} per slot; 'attn' needs {fmt_bytes(need)}" in text
    # the step is the graph of walks a and b's family, captured at 128 windows
    assert "the fa2 backend at enc on a+b at windows=128 keeps" in text and "would fail at capture" in text
    assert f"--set resources.ws.bytes={10 * MiB}" in text
    with pytest.raises(InvalidInput, match=r"(?s)'attn_o' needs 18.22 MiB.* at other on c at windows=256"):
        sizes(two_encoders("ws", "ws", (WorkspaceSpec(name="ws", bytes=15 * MiB),)))


def test_the_refusal_names_the_smallest_step_with_the_largest_need():
    """Rungs 8, 16 and 32 windows all need the same (the split bound pads each to 132 tiles of 128
    rows): the refusal names 8 windows, so lowering the budget is seen not to help."""
    model = gc.Model(name="flat", nodes=[enc_node()],
                     resources=[WorkspaceSpec(name="ws", bytes=MiB), ragged("attn", "ws")],
                     walks=[gc.Walk(name="a", kind="prefill", path=("enc",), ladder=(8, 16), budget=gc.Budget(windows=32))])
    with pytest.raises(InvalidInput, match=re.escape(f"needs {fmt_bytes(fa2_ragged_need(8))}")) as e:
        sizes(model)
    assert "at enc on a at windows=8 keeps" in str(e.value)


def test_no_float_workspace_needed_floors_at_a_mib_on_gpus_and_nothing_on_cpu():
    """fa3 (h100) and torch (cpu) keep no partials: need 0. A GPU still gets 1 MiB per workspace (x
    its slots); the cpu gets none, so the ledger has no workspace line."""
    model = gc.Model(name="none", nodes=[enc_node("enc", resources={"attn": "a"}), enc_node("e2", resources={"attn": "b"})],
                     resources=[WorkspaceSpec(name="ws", slots=3), ragged("a", "ws", "auto"), ragged("b", None, "auto")],
                     walks=[gc.Walk(name="w", kind="prefill", path=("enc",), budget=gc.Budget(windows=4)),
                            gc.Walk(name="v", kind="prefill", path=("e2",), budget=gc.Budget(windows=4))])
    gpu = sizes(model).resources.workspaces
    assert (gpu["ws"].need.bytes, gpu["ws"].bytes) == (0, 3 * MiB)
    assert (gpu["b"].need.bytes, gpu["b"].bytes) == (0, MiB)
    result = run_passes(model, get_target("cpu"), 1)
    cpu = result.sizing.resources.workspaces
    assert (cpu["ws"].need.bytes, cpu["ws"].bytes, cpu["b"].need.bytes, cpu["b"].bytes) == (0, 0, 0, 0)
    assert not [i for i in result.placement.devices[0].items if i.component.startswith("workspace.")]


def test_wrapper_buffers_per_captured_graph():
    """One list per captured graph: a ragged fa2 wrapper keeps two int32 indptrs of windows + 1 entries
    (one segment per window) at the graph's rung, and the resource's wrappers share one 8 MiB int
    workspace, listed with one graph only; torch keeps none."""
    model = gc.Model(name="wr", nodes=[enc_node()], resources=[ragged("attn")],
                     walks=[gc.Walk(name="a", kind="prefill", path=("enc",), ladder=(2,), budget=gc.Budget(windows=8))])
    wrappers = sizes(model).resources.wrappers
    assert set(wrappers) == {("enc", "prefill:windows", r) for r in (2, 8)}
    for (_, _, r), bufs in wrappers.items():
        assert [b for b in bufs if b[1] != "int_workspace"] == [("attn", "qo_indptr", 4 * (r + 1)),
                                                                ("attn", "kv_indptr", 4 * (r + 1))]
    ints = [b for bufs in wrappers.values() for b in bufs if b[1] == "int_workspace"]
    assert ints == [("attn", "int_workspace", 8 * MiB)]
    cpu = model.model_copy(update={"resources": (ragged("attn", backend="auto"),)})
    assert sizes(cpu, "cpu").resources.wrappers == {}


def test_weights_are_sized_per_config_and_dtype():
    """Same module, three configs: lin [64, 64] (8 KiB in bf16) plus a ballast of 1000 or 3000
    parameters, and the 1000 one again in float32: each sized on its own."""
    def blob(name, ballast, dtype="bfloat16"):
        return blob_node(name, ballast).model_copy(update={"dtype": dtype})
    model = gc.Model(name="w", nodes=[blob("a", 1000), blob("b", 3000), blob("c", 1000, "float32")],
                     walks=[gc.Walk(name=n, kind="prefill", path=(n,), budget=gc.Budget(tokens=4)) for n in "abc"])
    w = run_passes(model, get_target("cpu"), 1).sizing.weights.per_node
    assert [w[n].params for n in "abc"] == [8192 + 2000, 8192 + 6000, 16384 + 4000]
    assert [w[n].arena for n in "abc"] == [8192 + 2048, 8192 + 6144, 16384 + 4096]   # each tensor 256-B aligned
