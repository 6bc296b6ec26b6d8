"""The fake-tensor simulation: traces record what a forward allocates, and refuse bad nodes."""
import pytest
import torch

import graphc as gc
from graphc.errors import InvalidInput
from graphc.simulate import FakeNode


class Chain(gc.NodeModule):
    """x -> a = W1 x -> b = W2 a: a dies when b is made; peak holds a and b at once."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(8, 16, bias=False)
        self.l2 = torch.nn.Linear(16, 4, bias=False)

    def forward(self, ctx, x):
        return {"y": self.l2(self.l1(x))}


class Sync(gc.NodeModule):
    def forward(self, ctx, x):
        return {"y": x[x > 0]}   # a data-dependent shape


def node(module, out=("tokens", 4), dtype="float32"):
    return gc.Node(name="n", module=module, dtype="float32",
                   inputs={"x": gc.Port(shape=("tokens", 8), dtype="float32")},
                   outputs={"y": gc.Port(shape=out, dtype=dtype)})


def test_trace_counts_intermediates_and_outputs():
    n = node(Chain)
    fake = FakeNode(n)
    t = fake.trace(n.inputs, {"tokens": 10}, {}, "test")
    a, b = 10 * 16 * 4, 10 * 4 * 4
    assert [e for e in t.events if e[0] == 1] == [(1, 0, a), (1, 1, b)]
    assert t.peak_bytes == a + b and t.output_bytes == b
    assert sum(n for k, _, n in t.events if k == 1) == sum(n for k, _, n in t.events if k == 0)


def test_trace_scales_with_the_step():
    n = node(Chain)
    fake = FakeNode(n)
    small, big = (fake.trace(n.inputs, {"tokens": s}, {}, "t").peak_bytes for s in (4, 40))
    assert big == 10 * small


def test_output_that_disagrees_with_its_port_is_refused():
    n = node(Chain, out=("tokens", 5))
    with pytest.raises(InvalidInput, match=r"(?s)output 'y' is \[3, 4\] float32.*declares \['tokens', 5\]"):
        FakeNode(n).trace(n.inputs, {"tokens": 3}, {}, "node 'n'")


def test_data_dependent_forward_is_refused():
    n = node(Sync, out=("tokens", 8))
    with pytest.raises(InvalidInput, match="(?s)fails on fake tensors.*cannot be captured"):
        FakeNode(n).trace(n.inputs, {"tokens": 3}, {}, "node 'n'")


def test_tiny_decoder_trace_is_balanced(tiny):
    from graphc.passes.simulate_steps import bindings
    from graphc.verify import verify_graph
    from graphc.targets import get_target

    ir = verify_graph(tiny.model, get_target("h100"), 1)
    step = next(s for s in ir.steps if s.walk == "audio_prefill" and s.node == "decoder")
    node_decl = ir.node("decoder")
    ports = {p: node_decl.inputs[p] for p in step.inputs}
    t = FakeNode(node_decl).trace(ports, step.sizes_at(64), bindings(ir, step, 64), "decoder")
    assert t.peak_bytes > 0
    assert t.output_bytes == 4 * 512 * 4     # logits [seqs=4, vocab=512] fp32


class Views(gc.NodeModule):
    """Two kernels (a matmul and an add) around views that launch none."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(8, 4, bias=False)

    def forward(self, ctx, x):
        y = self.l1(x.view(-1, 8)).t().t()   # linear on a 2-D input is one mm; its weight.t() is a view
        return {"y": y.reshape(-1, 4) + 1}


def test_trace_counts_kernel_launches_not_views():
    n = node(Views)
    t = FakeNode(n).trace(n.inputs, {"tokens": 3}, {}, "test")
    assert t.launches == 2 and t.num_ops > t.launches


class Transposes(gc.NodeModule):
    """Three layers, each adding one to its input read transposed. Reshaping a non-contiguous tensor
    is aten.clone and then aten._unsafe_view, which aliases the copy although its schema says not."""

    def forward(self, ctx, x):
        for _ in range(3):
            x = (x.t().reshape(-1) + 1).view(x.shape)
        return {"y": x}


def test_reshape_copies_once_in_every_layer_whatever_ran_before():
    from graphc import memo

    n = node(Transposes, out=("tokens", 8))
    b = 5 * 8 * 4                              # x [5, 8] fp32
    # by hand, layer i: its copy c_i, then the sum s_i, then c_i dies, then the previous sum
    want = [(1, 0, b), (1, 1, b), (0, 0, b),
            (1, 2, b), (1, 3, b), (0, 2, b), (0, 1, b),
            (1, 4, b), (1, 5, b), (0, 4, b), (0, 3, b),
            (0, 5, b)]                         # the output, dropped after the step
    memo.clear()
    cold = FakeNode(n).trace(n.inputs, {"tokens": 5}, {}, "test")   # layer 1 runs each op, 2 and 3 hit the memo
    warm = FakeNode(n).trace(n.inputs, {"tokens": 5}, {}, "test")   # every op hits the memo
    assert list(cold.events) == want and cold.peak_bytes == 3 * b
    assert warm == cold and warm.digest == cold.digest


class Keeps(gc.NodeModule):
    def forward(self, ctx, x):
        self.last = x + 1          # outlives the step
        return {"y": x * 2}


def test_forward_that_keeps_a_tensor_alive_is_refused():
    n = node(Keeps, out=("tokens", 8))
    with pytest.raises(InvalidInput, match=r"(?s)keeps 96 B of tensors alive.*captured graph would pin"):
        FakeNode(n).trace(n.inputs, {"tokens": 3}, {}, "node 'n'")
