"""The linear-state resource's contract, worked by hand: bytes per layer and per slot for the real Qwen3.5
shapes, the ledger's lines, the tensors the runtime allocates, the slot allocator's refusals and leak check,
and what a step's binding refuses."""
from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from resources.linear_state import LinearStateSpec, SlotAllocator, StateStep, new_state

MiB = 1 << 20


def spec_9b(**kw) -> LinearStateSpec:
    """Qwen3.5-9B's linear layers: 24 of 32 (3 of every 4), 16 key and 32 value heads of 128, kernel 4."""
    args = dict(name="gdn_state", num_layers=24, num_key_heads=16, num_value_heads=32, key_head_dim=128,
                value_head_dim=128, conv_kernel=4)
    return LinearStateSpec(**(args | kw))


def test_qwen3_5_9b_by_hand():
    s = spec_9b()
    # key_dim 16 x 128 = 2048, value_dim 32 x 128 = 4096, conv channels 2 x 2048 + 4096 = 8192
    assert (s.key_dim, s.value_dim, s.conv_dim) == (2048, 4096, 8192)
    # conv: 8192 channels x 3 rows x 2 B (bf16) = 49,152 B = 48 KiB per layer per slot
    assert s.conv_layer_bytes == 8192 * 3 * 2 == 49_152
    # recurrent: 32 heads x 128 x 128 x 4 B (fp32) = 2 MiB per layer per slot
    assert s.recurrent_layer_bytes == 32 * 128 * 128 * 4 == 2 * MiB
    # a slot: 24 x (49,152 + 2,097,152) = 51,511,296 B = 49.125 MiB (the reference's 49.12 MiB)
    assert s.slot_bytes == 24 * 2_146_304 == 51_511_296
    assert s.slot_bytes / MiB == 49.125
    # 64 streams: 3,296,722,944 B, 3.07 GiB of state that KV pages alone never show
    assert s.bytes_for(64) == 3_296_722_944
    # a bf16 recurrent state: 1 MiB per layer, 24 x (49,152 + 1,048,576) = 26,345,472 B = 25.125 MiB a slot
    b = spec_9b(state_dtype="bfloat16")
    assert b.recurrent_layer_bytes == 1 * MiB and b.slot_bytes == 26_345_472 and b.slot_bytes / MiB == 25.125


def test_qwen3_5_0_8b_by_hand():
    # 18 of 24 layers, 16 key and 16 value heads of 128: conv 6144 x 3 x 2 = 36,864; recurrent 16 x 128 x 128 x 4
    s = spec_9b(num_layers=18, num_value_heads=16)
    assert (s.conv_dim, s.conv_layer_bytes, s.recurrent_layer_bytes) == (6144, 36_864, MiB)
    assert s.slot_bytes == 18 * (36_864 + MiB) == 19_537_920            # 18.63 MiB


def test_the_formulas_say_their_arithmetic():
    s = spec_9b()
    assert s.conv_formula() == "(2 x 16 x 128 + 32 x 128) channels x 3 rows x 2 B = 49152 B per layer per slot"
    assert s.recurrent_formula() == "32 value heads x 128 x 128 x 4 B = 2097152 B per layer per slot"


def test_one_ledger_line_per_layer_group_adding_up():
    s = spec_9b()
    lines = s.lines(64)
    assert [label for label, _ in lines] == ["gdn_state.conv", "gdn_state.recurrent"]
    conv, rec = (sized for _, sized in lines)
    assert conv.bytes == 24 * 64 * 49_152 and rec.bytes == 24 * 64 * 2 * MiB
    assert conv.bytes + rec.bytes == s.bytes_for(64)
    assert conv.formula.startswith("24 layers x 64 slots x (2 x 16 x 128 + 32 x 128) channels")
    assert rec.formula == "24 layers x 64 slots x 32 value heads x 128 x 128 x 4 B = 2097152 B per layer per slot"


@pytest.mark.parametrize("conv_dtype, state_dtype", [("float32", "float32"), ("bfloat16", "float32"),
                                                     ("bfloat16", "bfloat16"), ("float16", "float32")])
def test_the_allocated_tensors_hold_exactly_the_counted_bytes(conv_dtype, state_dtype):
    s = LinearStateSpec(name="st", num_layers=3, num_key_heads=2, num_value_heads=4, key_head_dim=8,
                        value_head_dim=6, conv_kernel=4, conv_dtype=conv_dtype, state_dtype=state_dtype)
    st = new_state(s, 5)
    assert st.conv.shape == (3, 5, 2 * 16 + 24, 3) and st.recurrent.shape == (3, 5, 4, 8, 6)
    assert (st.conv.dtype, st.recurrent.dtype) == (getattr(torch, conv_dtype), getattr(torch, state_dtype))
    held = st.conv.untyped_storage().nbytes() + st.recurrent.untyped_storage().nbytes()
    assert held == 5 * s.slot_bytes == sum(sized.bytes for _, sized in s.lines(5))
    assert st.num_slots == 5


def test_the_defaults_a_declaration_gets():
    s = LinearStateSpec(name="st", num_layers=1, num_key_heads=1, num_value_heads=1, key_head_dim=1, value_head_dim=1)
    assert (s.kind, s.conv_kernel, s.conv_dtype, s.state_dtype, s.slots) == \
        ("linear_state", 4, "bfloat16", "float32", None)


@pytest.mark.parametrize("kw, message", [
    (dict(state_dtype="int8"), r"state_dtype 'int8' is not one of \['bfloat16', 'float16', 'float32'\]"),
    (dict(conv_dtype="fp8"), r"conv_dtype 'fp8' is not one of"),
    (dict(num_key_heads=3), r"num_value_heads 32 must be a multiple of num_key_heads 3"),
    (dict(conv_kernel=1), r"conv_kernel"),
    (dict(slots=0), r"slots"),
    (dict(num_layers=0), r"num_layers"),
    (dict(slot=3), r"unknown key 'slot' in LinearStateSpec; did you mean 'slots'\?"),
])
def test_a_bad_spec_is_refused_with_the_reason(kw, message):
    with pytest.raises(ValidationError, match=message):
        spec_9b(**kw)


def test_slots_go_one_per_sequence_and_refuse_when_none_is_free():
    slots = SlotAllocator(3)
    got = [slots.allocate() for _ in range(3)]
    assert sorted(got) == [0, 1, 2] and slots.num_free == 0 and not slots.can_allocate()
    with pytest.raises(RuntimeError, match=r"no free state slot: all 3 slots are held by running sequences; "
                                           r"call can_allocate\(\) first"):
        slots.allocate()
    slots.free(got[1])
    assert slots.can_allocate() and slots.allocate() == got[1]


def test_a_slot_is_given_back_once_and_the_leak_check_sees_a_held_one():
    slots = SlotAllocator(4)
    a, b = slots.allocate(), slots.allocate()
    for bad in (a + 2, 4, -1):
        with pytest.raises(RuntimeError, match=rf"freeing state slot {bad} that is not held .* 2 of 4 are held"):
            slots.free(bad)
        assert slots.num_free == 2                     # refused before anything changed
    slots.free(a)
    with pytest.raises(RuntimeError, match=rf"freeing state slot {a} that is not held \(never allocated, already "
                                           r"freed or out of range 0..3\)"):
        slots.free(a)                                  # a second time
    assert not slots.all_free() and slots.num_free == 3    # the leak: b is still out
    slots.free(b)
    assert slots.all_free() and slots.num_free == 4


def test_a_pool_needs_a_slot():
    with pytest.raises(ValueError, match="at least 1 slot, got 0"):
        SlotAllocator(0)


def small_state():
    s = LinearStateSpec(name="st", num_layers=2, num_key_heads=1, num_value_heads=2, key_head_dim=4,
                        value_head_dim=3, conv_dtype="float32")
    return new_state(s, 4)


def test_a_step_knows_its_rows_and_slots():
    step = StateStep(small_state(), [3, 0, 2], [5, 1, 2], [False, True, True])
    assert step.cu_seqlens == [0, 5, 6, 8] and step.num_rows == 8
    assert step.slots.tolist() == [3, 0, 2] and step.has_state.tolist() == [False, True, True]
    step.conv(1)[3].fill_(7.0)
    assert step.state.conv[1, 3].eq(7.0).all()          # a layer's slots are views of the pool


@pytest.mark.parametrize("slot_ids, lens, has, message", [
    ([0, 0], [1, 1], [True, True], r"slot ids \[0, 0\] must be distinct"),
    ([0, 4], [1, 1], [True, True], r"within 0..3 \(out of range: \[4\]\)"),
    ([0, 1], [1, 0], [True, True], r"at least one row, got lengths \[1, 0\]"),
    ([0, 1], [1], [True, True], r"got 2 slots, 1 lengths and 2 has_state"),
    ([], [], [], r"got 0 slots"),
])
def test_a_step_refuses_inconsistent_sequences(slot_ids, lens, has, message):
    with pytest.raises(ValueError, match=message):
        StateStep(small_state(), slot_ids, lens, has)
