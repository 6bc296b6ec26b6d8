"""The simulation's pieces one by one: storage sizes against what torch allocates, which op outputs
the op memo may rebuild from metadata, which ops launch kernels, the memo's keys, convolution
signatures, and what reference cycles hold.

Expected values come from torch itself (empty_strided's storages, the ops' schemas) or are worked by
hand; none is read back from graphc/simulate.py or graphc/strided.py.
"""
from __future__ import annotations

import gc as pygc

import pytest
import torch

import graphc as gc
from graphc import memo
from graphc import simulate as sim
from graphc.simulate import FakeNode
from graphc.strided import storage_bytes

aten = torch.ops.aten


# ------------------------------------------------------------------ storage sizes

@pytest.mark.parametrize("shape, stride, dtype", [
    ((3, 4), (4, 1), torch.float32),           # contiguous
    ((4, 3), (1, 4), torch.float32),           # transposed
    ((2, 3, 5), (15, 1, 3), torch.bfloat16),   # permuted, 2-byte elements
    ((4, 3), (0, 1), torch.int64),             # expanded: one row shared by four
    ((2, 2), (7, 2), torch.float32),           # gaps between rows and elements
    ((), (), torch.float32),                   # a scalar
    ((7,), (1,), torch.int8),
    ((0, 5), (10, 1), torch.float32),          # empty: the formula alone would give -5 elements
    ((5, 0), (1, 1), torch.float16),
])
def test_storage_bytes_is_what_empty_strided_allocates(shape, stride, dtype):
    t = torch.empty_strided(shape, stride, dtype=dtype)
    assert storage_bytes(t) == t.untyped_storage().nbytes()


# ------------------------------------------------------------------ what the op memo may rebuild

def test_a_fresh_tensor_is_rebuilt_from_its_layout():
    out = torch.empty_strided((3, 4), (1, 3), dtype=torch.bfloat16)
    assert sim._layouts(out, set()) == (torch.Tensor, [((3, 4), (1, 3), torch.bfloat16)])


@pytest.mark.parametrize("container", [tuple, list])
def test_several_fresh_outputs_keep_their_container(container):
    out = container([torch.empty(2, 3), torch.empty(5, dtype=torch.int64)])
    assert sim._layouts(out, set()) == (container, [((2, 3), (3, 1), torch.float32), ((5,), (1,), torch.int64)])


@pytest.mark.parametrize("out", [3, None, (), [], (torch.empty(2), 1), [torch.empty(2), None]])
def test_outputs_that_are_not_all_tensors_always_run(out):
    assert sim._layouts(out, set()) is None


def test_an_output_aliasing_an_input_always_runs():
    x = torch.empty(4, 4)
    out = x.view(16)                                   # shares x's storage
    assert sim._layouts(out, {id(x.untyped_storage())}) is None
    assert sim._layouts(out, {id(torch.empty(1).untyped_storage())}) is not None   # another input: fine


def test_outputs_aliasing_each_other_always_run():
    a = torch.empty(8)
    assert sim._layouts((a[:8], a.view(2, 4)), set()) is None


def test_an_output_at_an_offset_or_in_a_larger_storage_always_runs():
    base = torch.empty(10)
    assert sim._layouts(base[2:], set()) is None       # offset 2
    assert sim._layouts(base[:5], set()) is None       # offset 0, but 40 B of storage for 20 B
    assert sim._layouts(base[:10], set()) is not None  # the whole storage


@pytest.mark.parametrize("op, fresh, view", [
    (aten.mm.default, True, False),
    (aten.add.Tensor, True, False),
    (aten.clone.default, True, False),
    (aten.view.default, False, True),
    (aten.t.default, False, True),
    (aten.split.Tensor, False, True),                  # several outputs, all views
    (aten.add_.Tensor, False, False),                  # writes its input
    (aten.copy_.default, False, False),
    (aten._assert_async.default, True, False),         # returns nothing: a kernel, not a view
])
def test_fresh_ops_and_views_from_their_schemas(op, fresh, view):
    assert sim._fresh(op) is fresh
    assert sim._view(op) is view


# ------------------------------------------------------------------ the op memo's keys

class Square(gc.NodeModule):
    """y = x @ x.T: one mm whose output's bytes depend on the input's shape and dtype."""

    def forward(self, ctx, x):
        return {"y": x @ x.t()}


def square(dtype: str) -> gc.Node:
    return gc.Node(name="n", module=Square, dtype=dtype, inputs={"x": gc.Port(shape=("tokens", 8), dtype=dtype)},
                   outputs={"y": gc.Port(shape=("tokens", "tokens"), dtype=dtype)})


def test_the_memo_tells_dtypes_and_shapes_apart():
    memo.clear()
    for dtype, size in (("float32", 4), ("bfloat16", 2), ("float32", 4)):
        for tokens in (3, 6):
            n = square(dtype)
            t = FakeNode(n).trace(n.inputs, {"tokens": tokens}, {}, "test")
            b = tokens * tokens * size
            assert list(t.events) == [(1, 0, b), (0, 0, b)], (dtype, tokens)


def test_the_memo_holds_fresh_ops_and_marks_aliasing_ones():
    memo.clear()
    n = square("float32")
    FakeNode(n).trace(n.inputs, {"tokens": 3}, {}, "test")
    mm = [v for k, v in sim._META_CACHE.items() if k[0] is aten.mm.default]
    assert mm == [(torch.Tensor, [((3, 3), (3, 1), torch.float32)])]


class SumTo(gc.NodeModule):
    """A reduction whose output dtype is a keyword argument."""
    out_dtype = torch.float32

    def forward(self, ctx, x):
        return {"y": torch.sum(x, dim=1, dtype=self.out_dtype)}


class SumToHalf(SumTo):
    out_dtype = torch.float16


def test_the_memo_key_holds_keyword_arguments():
    memo.clear()
    for module, size in ((SumTo, 4), (SumToHalf, 2), (SumTo, 4)):
        dtype = str(module.out_dtype).removeprefix("torch.")
        n = gc.Node(name="n", module=module, dtype="float32", inputs={"x": gc.Port(shape=("tokens", 8), dtype="float32")},
                    outputs={"y": gc.Port(shape=("tokens",), dtype=dtype)})
        t = FakeNode(n).trace(n.inputs, {"tokens": 5}, {}, "test")
        assert [e for e in t.events if e[0] == 1] == [(1, 0, 5 * size)], dtype


# ------------------------------------------------------------------ convolutions

class Convs(gc.NodeModule):
    """A conv1d (8 -> 4 channels, kernel 3, padding 1, bias) and a grouped transposed conv1d
    (4 -> 6 channels, kernel 4, stride 2, groups 2, output padding 1, no bias)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 4, 3, padding=1)
        self.up = torch.nn.ConvTranspose1d(4, 6, 4, stride=2, groups=2, output_padding=1, bias=False)

    def forward(self, ctx, x):
        h = self.conv(x.t().unsqueeze(0))          # [1, 4, tokens]
        return {"y": self.up(h)[0]}                # [6, (tokens - 1) * 2 + 4 + 1]


def test_convolutions_are_signed_by_shape_dtype_and_geometry():
    n = gc.Node(name="n", module=Convs, dtype="float32", inputs={"x": gc.Port(shape=("tokens", 8), dtype="float32")},
                outputs={"y": gc.Port(shape=(6, 13), dtype="float32")})
    t = FakeNode(n).trace(n.inputs, {"tokens": 5}, {}, "test")
    # by hand: the first conv's output is the step's first allocation; the second conv's output is
    # the second (its input h is still alive), so each is recorded after its own output
    assert [e for e in t.events if e[0] == 1] == [(1, 0, 4 * 5 * 4), (1, 1, 6 * 13 * 4)]
    assert t.convs == ((1, "conv x[1,8,5] w[4,8,3] float32 bias s1 p1 d1 op0 g1"),
                       (2, "convT x[1,4,5] w[4,3,4] float32 s2 p0 d1 op1 g2"))


# ------------------------------------------------------------------ reference cycles

class Cycle(gc.NodeModule):
    """A temporary that only a reference cycle holds once the forward returns."""

    def forward(self, ctx, x):
        box = [x * 3]
        box.append(box)
        return {"y": x + 1}


def test_what_a_cycle_holds_dies_at_the_steps_end_and_the_collector_is_restored():
    n = gc.Node(name="n", module=Cycle, dtype="float32", inputs={"x": gc.Port(shape=("tokens", 8), dtype="float32")},
                outputs={"y": gc.Port(shape=("tokens", 8), dtype="float32")})
    b = 4 * 8 * 4
    assert pygc.isenabled()
    t = FakeNode(n).trace(n.inputs, {"tokens": 4}, {}, "test")
    # by hand: the temporary, the output; the output dropped after the step; the temporary when the
    # cycle is collected at the step's end
    assert list(t.events) == [(1, 0, b), (1, 1, b), (0, 1, b), (0, 0, b)]
    assert t.peak_bytes == 2 * b and t.output_bytes == b
    assert pygc.isenabled()


def test_the_collector_stays_off_if_it_was_off():
    n = gc.Node(name="n", module=Cycle, dtype="float32", inputs={"x": gc.Port(shape=("tokens", 8), dtype="float32")},
                outputs={"y": gc.Port(shape=("tokens", 8), dtype="float32")})
    pygc.disable()
    try:
        FakeNode(n).trace(n.inputs, {"tokens": 2}, {}, "test")
        assert not pygc.isenabled()
    finally:
        pygc.enable()


def test_weights_and_inputs_are_not_allocations():
    class Lin(gc.NodeModule):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(8, 8, bias=True)
            self.register_buffer("scale", torch.ones(8))

        def forward(self, ctx, x):
            return {"y": self.l(x) * self.scale}

    n = gc.Node(name="n", module=Lin, dtype="float32", inputs={"x": gc.Port(shape=("tokens", 8), dtype="float32")},
                outputs={"y": gc.Port(shape=("tokens", 8), dtype="float32")})
    t = FakeNode(n).trace(n.inputs, {"tokens": 2}, {}, "test")
    b = 2 * 8 * 4      # the linear's output, then the product; never the weight, bias, buffer or x
    assert list(t.events) == [(1, 0, b), (1, 1, b), (0, 0, b), (0, 1, b)]


def test_the_digest_is_of_the_events():
    a = sim.Trace(((1, 0, 64), (0, 0, 64)), 64, 0, 2)
    assert a.digest == sim.Trace(((1, 0, 64), (0, 0, 64)), 64, 64, 5, 3).digest
    assert a.digest != sim.Trace(((1, 0, 64), (0, 0, 65)), 64, 0, 2).digest


class OneOp(gc.NodeModule):
    def forward(self, ctx, x):
        return {"y": x * 2}


def test_ops_are_counted_one_by_one():
    n = gc.Node(name="n", module=OneOp, dtype="float32", inputs={"x": gc.Port(shape=("tokens", 8), dtype="float32")},
                outputs={"y": gc.Port(shape=("tokens", 8), dtype="float32")})
    t = FakeNode(n).trace(n.inputs, {"tokens": 2}, {}, "test")
    assert (t.num_ops, t.launches) == (1, 1)                    # aten.mul.Tensor, a kernel


class TinyCycle(gc.NodeModule):
    """A cycle that holds a one-byte tensor: the smallest thing a step can leave to the collector."""

    def forward(self, ctx, x):
        box = [x.new_zeros(1, dtype=torch.uint8)]
        box.append(box)
        return {"y": x + 1}


def test_a_cycle_holding_one_byte_is_collected_too():
    n = gc.Node(name="n", module=TinyCycle, dtype="float32", inputs={"x": gc.Port(shape=("tokens", 8), dtype="float32")},
                outputs={"y": gc.Port(shape=("tokens", 8), dtype="float32")})
    t = FakeNode(n).trace(n.inputs, {"tokens": 1}, {}, "test")
    assert list(t.events) == [(1, 0, 1), (1, 1, 32), (0, 1, 32), (0, 0, 1)]


class WrongKeys(gc.NodeModule):
    def forward(self, ctx, x):
        return {"z": x + 1}


class NotADict(gc.NodeModule):
    def forward(self, ctx, x):
        return x + 1


@pytest.mark.parametrize("module, got", [(WrongKeys, r"\['z'\]"), (NotADict, "Tensor")])
def test_a_forward_must_return_its_declared_outputs(module, got):
    from graphc.errors import InvalidInput

    n = gc.Node(name="n", module=module, dtype="float32", inputs={"x": gc.Port(shape=("tokens", 8), dtype="float32")},
                outputs={"y": gc.Port(shape=("tokens", 8), dtype="float32")})
    with pytest.raises(InvalidInput, match=rf"node 'n': forward returned {got}, the node declares outputs \['y'\]"):
        FakeNode(n).trace(n.inputs, {"tokens": 2}, {}, "node 'n'")


class Reshaped(gc.NodeModule):
    def forward(self, ctx, x):
        return {"y": x.view(-1)}           # a view of the input: nothing allocated


def test_a_step_that_allocates_nothing_peaks_at_zero():
    n = gc.Node(name="n", module=Reshaped, dtype="float32", inputs={"x": gc.Port(shape=("tokens", 8), dtype="float32")},
                outputs={"y": gc.Port(shape=(16,), dtype="float32")})
    t = FakeNode(n).trace(n.inputs, {"tokens": 2}, {}, "test")
    assert (t.events, t.peak_bytes, t.launches) == ((), 0, 0)
