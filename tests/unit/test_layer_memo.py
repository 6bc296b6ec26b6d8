"""The simulation's layer memo (graphc/layer_memo.py) gives the trace a full run gives, event for event:
on Qwen3-Omni's real nodes (bf16, the plan's kernel choices, on an h100 target) at several steps and
rungs, and on blocks made to trip it: layers that differ by an attribute, a block that returns a view of
its input, a block that keeps a tensor alive past its call. The reference is the same trace with the
memo off; the memo must also have replayed blocks where it could (else it does nothing)."""
import pytest
import torch

import graphc.layer_memo as lm
from graphc.declare import Node, Port
from graphc.modules import set_kernels
from graphc.simulate import FakeNode
from graphc.step import NodeModule


def _both(trace, monkeypatch) -> tuple:
    """(memo on, memo off, blocks replayed with it on)."""
    replayed = []
    real = lm.Memo.replay

    def counting(self, seg):
        replayed.append(1)
        return real(self, seg)

    monkeypatch.setattr(lm.Memo, "replay", counting)
    monkeypatch.setattr(lm, "MEMO_ON", True)
    on = trace()
    monkeypatch.setattr(lm, "MEMO_ON", False)
    off = trace()
    return on, off, len(replayed)


@pytest.fixture(scope="module")
def omni():
    from graphc.passes.select_backends import select_backends
    from graphc.source import load_model
    from graphc.targets import get_target
    from graphc.verify import verify_graph

    ir = verify_graph(load_model("models/qwen3_omni.py").model, get_target("h100"), 2)
    return ir, select_backends(ir)


STEPS = [("thinker", "decode:seqs", 1), ("thinker", "decode:seqs", 64), ("thinker", "prefill:tokens+audio+visual", 128),
         ("talker", "decode:seqs", 2), ("vision_encoder", "prefill:patches", 1024),
         ("audio_encoder", "prefill:windows", 4), ("code2wav", "prefill:frames@100", 200)]


@pytest.mark.parametrize("node,family,rung", STEPS)
def test_real_nodes_trace_the_same_with_the_memo(omni, node, family, rung, monkeypatch):
    from graphc.passes.simulate_steps import bindings

    ir, backends = omni
    step = ir.family(node, family)
    decl = ir.node(node)
    fake = FakeNode(decl)
    set_kernels(fake.module, backends.kernels.get(node, {}))
    ports = {p: decl.inputs[p] for p in step.inputs}
    sizes = step.sizes_at(rung)

    def trace():
        return fake.trace(ports, sizes, bindings(ir, step, rung, backends), node)

    on, off, replayed = _both(trace, monkeypatch)
    assert on == off
    assert replayed > 0


class Block(torch.nn.Module):
    calls = [0]                # kind "counter": state the memo's key cannot see

    def __init__(self, width: int, kind: str = "plain"):
        super().__init__()
        self.width, self.kind = width, kind
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if self.kind == "counter":
            Block.calls[0] += 1
        n = self.width * (Block.calls[0] if self.kind == "counter" else 1)
        extra = torch.empty(n, device=x.device)                # sized by an attribute (or by the counter)
        y = y + extra.sum()
        if self.kind == "view":
            return x[:, :4]                                    # an alias of its input: never replayed
        if self.kind == "slice":
            return y[:, 4:]                                    # a view of a storage of its own: never replayed
        if self.kind == "stash":
            self.kept = torch.empty(3, device=x.device)        # outlives the call: never replayed
        return y


class Stack(NodeModule):
    def __init__(self, cfg: tuple):
        super().__init__()
        widths, kind = cfg
        self.blocks = torch.nn.ModuleList(Block(w, kind) for w in widths)

    def forward(self, ctx, x):
        Block.calls[0] = 0
        for b in self.blocks:
            out = b(x)
            x = out if out.shape == x.shape else torch.cat([out, out], dim=1)
        if hasattr(self.blocks[0], "kept"):
            for b in self.blocks:
                del b.kept
        return {"y": x}


def _trace(widths, kind, monkeypatch):
    port = Port(shape=("tokens", 8), dtype="float32")
    node = Node(name="n", module=Stack, config=(tuple(widths), kind), dtype="float32", inputs={"x": port},
                outputs={"y": port})
    fake = FakeNode(node)
    return _both(lambda: fake.trace({"x": port}, {"tokens": 5}, {}, "n"), monkeypatch)


@pytest.mark.parametrize("widths,kind,replays", [
    ([16] * 6, "plain", 4),                  # the first two run and agree: the other four are replayed
    ([16, 16, 16, 32, 32, 16], "plain", 2),  # 16 runs at 0 and 1, is replayed at 2 and 5; 32 runs at 3 and 4
    ([16] * 6, "view", 0),                   # returns a view of its input
    ([16] * 6, "slice", 0),                  # returns a view into a storage it allocated
    ([16] * 6, "counter", 0),                # the same key, but its first two calls allocate differently
])
def test_made_up_blocks_trace_the_same(widths, kind, replays, monkeypatch):
    on, off, replayed = _trace(widths, kind, monkeypatch)
    assert on == off and replayed == replays


def test_a_block_that_keeps_a_tensor_is_not_replayed(monkeypatch):
    on, off, replayed = _trace([16] * 5, "stash", monkeypatch)
    assert on == off and replayed == 0
