"""simulate_steps traces each eager step as its own node on its own walk.

Two nodes on one walk, `narrow` then `wide`, each an MLP whose step of T tokens allocates, in bf16,
    h = up(x)    [T, F]    2*T*F B
    g = gelu(h)  [T, F]    2*T*F B     (h dies)
    y = down(g)  [T, 64]   128*T B     (g dies)
so its peak is h + g = 4*T*F B: F = 1024 for narrow, 16384 for wide. On the cpu every step is
eager, at the walk's budget of 8 tokens.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import graphc as gc
from graphc.passes.choose_buckets import choose_buckets
from graphc.passes.select_backends import select_backends
from graphc.passes.simulate_steps import simulate_steps
from graphc.verify import verify_graph
from graphc.targets import get_target

WIDTHS = {"narrow": 1024, "wide": 16384}
TOKENS = 8


class MLP(gc.NodeModule):
    def __init__(self, ffn: int):
        super().__init__()
        self.up = torch.nn.Linear(64, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, 64, bias=False)

    def forward(self, ctx, x):
        h = self.up(x)                 # [T, F]
        g = F.gelu(h)                  # [T, F]
        del h
        return {"y": self.down(g)}     # [T, 64]


def declare() -> gc.Model:
    port = gc.Port(shape=("tokens", 64), dtype="bfloat16")
    return gc.Model(
        name="two-mlps",
        nodes=[gc.Node(name=n, module=MLP, config=f, inputs={"x": port}, outputs={"y": port})
               for n, f in WIDTHS.items()],
        edges=[gc.Edge(src="narrow.y", dst="wide.x")],
        walks=[gc.Walk(name="prefill", kind="prefill", path=("narrow", "wide"),
                       budget=gc.Budget(tokens=TOKENS, seqs=1))],
        requests=[gc.RequestKind(name="t2t", stages=("prefill",))],
    )


def test_each_eager_step_is_its_own_nodes_trace():
    ir = verify_graph(declare(), get_target("cpu"), 1)
    buckets = choose_buckets(ir)
    assert buckets.eager == {("narrow", "prefill"): TOKENS, ("wide", "prefill"): TOKENS}
    acts = simulate_steps(ir, buckets, select_backends(ir))
    peaks = {n: acts.eager[(n, "prefill")].peak_bytes for n in WIDTHS}
    assert peaks == {n: 4 * TOKENS * f for n, f in WIDTHS.items()}, (
        "wide's step on the walk is wide's forward (peak 512 KiB), not the first step of the walk (narrow's)")
