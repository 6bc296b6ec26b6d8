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
    assert t.peak_bytes == a + b and t.output_bytes == b and t.retained_bytes == 0
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
    from graphc.passes.verify_graph import verify_graph
    from graphc.targets import get_target

    ir = verify_graph(tiny.model, get_target("h100"), 1)
    step = next(s for s in ir.steps if s.walk == "audio_prefill" and s.node == "decoder")
    node_decl = ir.node("decoder")
    ports = {p: node_decl.inputs[p] for p in step.inputs}
    t = FakeNode(node_decl).trace(ports, step.sizes_at(64), bindings(ir, step, 64), "decoder")
    assert t.retained_bytes == 0 and t.peak_bytes > 0
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
