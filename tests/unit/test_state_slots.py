"""The compiler plans linear-attention state (resources/linear_state.py) as slots: one per sequence the decode
walk runs at once, plus one for a captured step's padding rows; exact ledger lines; KV pages fill what the
slots leave; explain and the remedies say so; a captured rung on state slots is a decode rung, and holds its
slot ids.

The model is tests/shapes/hybrid_lm.py: 3 Gated DeltaNet layers then one attention layer, twice. Expected
bytes are worked by hand from its presets' numbers below, not from LinearStateSpec."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphc.errors import DoesNotFit, InvalidInput
from graphc.pipeline import compile_model
from graphc.report import explain
from graphc.source import load_model
from graphc.units import fmt_bytes

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "tests" / "shapes" / "hybrid_lm.py")

# tiny: hidden 32, 2 key heads and 4 value heads of 16, kernel 4, 6 linear layers, fp32 everywhere
TINY_CONV = (2 * 2 * 16 + 4 * 16) * 3 * 4           # channels x (kernel - 1) rows x 4 B = 1,536 B a layer a slot
TINY_RECURRENT = 4 * 16 * 16 * 4                     # value heads x dk x dv x 4 B = 4,096 B
# wide: hidden 1024, 8 key and 16 value heads of 128; conv state bf16, recurrent fp32; 6 linear layers
WIDE_SLOT = 6 * ((2 * 8 * 128 + 16 * 128) * 3 * 2 + 16 * 128 * 128 * 4)     # 6,438,912 B


def plan(preset: str = "tiny", gpu: str = "cpu", overrides: dict | None = None, **kw):
    return compile_model(load_model(MODEL, preset), gpu, 1, overrides or {}, **kw)


def ledger(compiled) -> dict[str, int]:
    return {i.component: i.bytes for i in compiled.result.placement.devices[0].items}


def test_cpu_plan_holds_one_slot_per_decode_sequence():
    """CPU: nothing is captured, so no padding slot: 8 slots for decode's 8 sequences."""
    c = plan()
    lines = ledger(c)
    assert lines["state.lm_state.conv"] == 6 * 8 * TINY_CONV == 73_728
    assert lines["state.lm_state.recurrent"] == 6 * 8 * TINY_RECURRENT == 196_608
    r = c.plan.resources["lm_state"]
    assert (r.slots, r.slot_bytes, r.bytes) == (8, 6 * (TINY_CONV + TINY_RECURRENT), 73_728 + 196_608)
    assert c.plan.resources["lm_kv"].slots is None and "slots" not in c.plan.dump()["resources"]["lm_kv"]


def test_captured_decode_adds_a_padding_slot():
    c = plan("wide", "h100")
    assert c.plan.resources["lm_state"].slots == 65
    assert sum(b for k, b in ledger(c).items() if k.startswith("state.")) == 65 * WIDE_SLOT
    eager = plan("wide", "h100", {"walks": {"decode": {"capture": False}}})
    assert eager.plan.resources["lm_state"].slots == 64


def test_state_slots_are_taken_from_the_kv_pages():
    """100 slots more (declared) hold 100 x WIDE_SLOT bytes more, and the fill pool gives them up: its bytes and
    the allocator model's lines (its rounding slack of the persistent buffers, and the eager prefill's pool, which
    the model lays out among the persistent segments: simulated lines both) pay for them, to a page."""
    base, more = plan("wide", "h100"), plan("wide", "h100", {"resources": {"lm_state": {"slots": 165}}})
    a, b = ledger(base), ledger(more)
    state = sum(b[k] - a[k] for k in a if k.startswith("state."))
    assert state == 100 * WIDE_SLOT
    page = base.plan.resources["lm_kv"].page_bytes
    paid = (a["kv.lm_kv"] - b["kv.lm_kv"]) + (a["allocator"] - b["allocator"]) + (a["activations"] - b["activations"])
    assert 0 <= paid - state < page, (paid, state)
    assert a["kv.lm_kv"] - b["kv.lm_kv"] > 0.95 * state
    assert {k for k in a if a[k] != b[k]} <= {"kv.lm_kv", "allocator", "activations", "state.lm_state.conv",
                                              "state.lm_state.recurrent"}


def test_declared_slots_fewer_than_the_streams_are_refused():
    with pytest.raises(InvalidInput) as e:
        plan("wide", "h100", {"resources": {"lm_state": {"slots": 64}}})
    text = str(e.value)
    assert "declares 64 slots; 65 are needed" in text
    assert "64 sequences at once (decode's seqs budget) + 1 for a captured step's padding rows" in text
    assert "--set resources.lm_state.slots=65" in text and "--set walks.decode.budget.seqs=63" in text
    assert plan("wide", "h100", {"resources": {"lm_state": {"slots": 65}}}).plan.resources["lm_state"].slots == 65


def test_explain_says_what_the_slots_hold_and_what_they_take_from_the_pages():
    text = explain(plan("wide", "h100").plan)
    assert f"lm_state (linear_state) backend fla on devices [0]: {fmt_bytes(65 * WIDE_SLOT)}; 65 slots x {WIDE_SLOT:,} B" \
        in text
    assert "delta rule: auto: first in preference order; sm_90 linear_state has fla, torch" in text
    assert "20 fixed buffers of captured state bindings (has_state, slot_ids)" in text
    assert "state slots: 64 sequences at once (decode's seqs budget) + 1 for a captured step's padding rows" in text
    assert f"state slots among them ({fmt_bytes(65 * WIDE_SLOT)} on device 0)" in text     # the KV pool's why
    assert "state.lm_state.recurrent" in text and "65 slots x 16 value heads x 128 x 128 x 4 B" in text.replace(
        "6 layers x ", "")


def test_remedies_count_the_state_fewer_streams_free():
    with pytest.raises(DoesNotFit) as e:
        plan("wide", "h100", memory_cap=1480 << 20)        # fits from about 1,530 MiB
    mine = [r for r in e.value.remedies if r.change.startswith("walks.decode.budget.seqs=")]
    assert mine, [r.change for r in e.value.remedies]
    assert not [r.why for r in e.value.remedies if r not in mine and "state" in r.why]       # prefill's budget: none
    for r in mine:
        seqs = int(r.change.rsplit("=", 1)[1])
        assert f"{64 - seqs} fewer lm_state slots, -{fmt_bytes((64 - seqs) * WIDE_SLOT)} of state" in r.why
        # the re-plan frees the slots, less what the allocator's segment tails of the persistent buffers may take
        # back (2.6 MB at 48 seqs: the caching allocator's packing changes with the sizes)
        assert r.freed >= 0.95 * (64 - seqs) * WIDE_SLOT


def test_a_step_trace_does_not_count_the_slots_it_writes_as_its_own():
    """The pool exists before the step: a decode step at 64 sequences writes 65 slots' worth of pool in place,
    and its trace must not see that as an allocation."""
    from graphc.simulate import FakeNode
    from resources.base import StepShape

    model = load_model(MODEL, "wide").model
    node = model.node("lm")
    shape = StepShape(rows=64, seqs=64, kv_len=0, phase="decode")
    binds = {"kv": model.resource("lm_kv").fake(shape), "state": model.resource("lm_state").fake(shape)}
    trace = FakeNode(node).trace(node.inputs, {"seqs": 64, "tokens": 64}, binds, "decode at 64")
    assert 0 < trace.peak_bytes < 65 * WIDE_SLOT, (trace.peak_bytes, 65 * WIDE_SLOT)


def test_a_captured_prompt_step_on_state_slots_is_refused_with_the_fix():
    """Captured steps on state slots run one row per sequence: a prefill walk captured on a GPU is refused when
    planned, naming the rung and the override that fixes it; the fixed plan plans."""
    with pytest.raises(InvalidInput) as e:
        plan("wide", "h100", {"walks": {"prefill": {"capture": True}}})
    text = str(e.value)
    assert "lm would capture prefill:tokens at" in text and "on 'lm_state', a linear_state resource" in text
    assert "--set walks.prefill.capture=false" in text and "walks.decode" not in text   # the family's walks only
    plan("wide", "h100", {"walks": {"prefill": {"capture": False}}})


def test_each_captured_decode_rung_holds_its_slot_ids_and_has_state():
    """A captured decode rung of r sequences binds r int64 slot ids and r bools (CapturedState's static tensors):
    9 r bytes, in the ledger's wrappers line of the state resource; a cpu plan captures nothing."""
    c = plan("wide", "h100")
    rungs = c.plan.nodes["lm"].graphs["decode:seqs"]
    items = {i.component: i for i in c.result.placement.devices[0].items}
    assert items["wrappers.lm_state"].bytes == sum(9 * r for r in rungs)
    assert rungs[-1] == 64 and len(rungs) > 3
    assert "wrappers.lm_state" not in ledger(plan())


def test_slots_follow_the_decode_walk_through_the_resource_node_only():
    """Another node's larger decode budget does not size this resource; a resource no walk with a seqs budget runs
    through is refused."""
    from types import SimpleNamespace

    import graphc as gc
    from graphc.passes.size_resources import state_slots
    from resources import LinearStateSpec

    spec = LinearStateSpec(name="st", num_layers=1, num_key_heads=1, num_value_heads=1, key_head_dim=2,
                           value_head_dim=2)
    walks = [gc.Walk(name="mine", kind="decode", path=("a",), budget=gc.Budget(seqs=4)),
             gc.Walk(name="theirs", kind="decode", path=("b",), budget=gc.Budget(seqs=16)),
             gc.Walk(name="fill", kind="prefill", path=("a",), budget=gc.Budget(tokens=64, seqs=8)),
             gc.Walk(name="wide", kind="decode", path=("c", "a"), budget=gc.Budget(seqs=6))]
    ir = SimpleNamespace(users={"st": [("a", "state")]}, model=SimpleNamespace(walks=walks),
                         target=SimpleNamespace(capture=True))
    got = state_slots(ir, spec)
    assert (got.slots, got.streams, got.walk) == (7, 6, "wide")        # the largest decode walk through 'a'
    ir.model.walks = walks[:3]
    assert state_slots(ir, spec).streams == 4                          # decode walks only, though prefill's is larger
    ir.model.walks = [walks[2]]
    assert state_slots(ir, spec).streams == 8                          # no decode walk: the largest seqs budget
    ir.model.walks = walks[1:2]
    with pytest.raises(InvalidInput, match="no walk through them has a seqs budget"):
        state_slots(ir, spec)


def test_the_delta_rule_backend_comes_from_the_capability_table():
    """sm_90 takes fla first (and sets its node's fla_gdn, gdn_fused and gdn_slots knobs, each 1: on, and takes away
    pdl and norm_gemv, measured no faster there); torch is asked for by name and sets none of the three but keeps
    pdl and norm_gemv; an arch whose row has no fla refuses it, naming what it has; the cpu runs torch."""
    c = plan("wide", "h100")
    knobs = c.plan.nodes["lm"].kernels
    assert c.plan.resources["lm_state"].backend == "fla" and (
        knobs.get("fla_gdn"), knobs.get("gdn_fused"), knobs.get("gdn_slots")) == (1, 1, 1)
    assert not {"pdl", "norm_gemv"} & set(knobs)
    t = plan("wide", "h100", {"resources": {"lm_state": {"backend": "torch"}}})
    assert t.plan.resources["lm_state"].backend == "torch"
    assert not {"fla_gdn", "gdn_fused", "gdn_slots"} & set(t.plan.nodes["lm"].kernels)
    assert {"pdl", "norm_gemv"} <= set(t.plan.nodes["lm"].kernels)
    with pytest.raises(InvalidInput) as e:
        plan("wide", "a100-80gb", {"resources": {"lm_state": {"backend": "fla"}}})
    assert "'fla' has no kernels for sm_80; a100-80gb has: torch" in str(e.value)
    assert plan().plan.resources["lm_state"].backend == "torch"
