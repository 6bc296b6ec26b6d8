"""Small models for the placement tests (tests/unit/test_placement.py), built from a few node specs
so that which placement wins, and how many pages each KV pool gets, can be worked out by hand.

Every node is one module holding a single bf16 weight of `weight_bytes / 2` elements (one arena,
256-B aligned), with one input x [T, 128] and one output y [T, 128] (bf16, T = tokens):

    Dense   y = x * 2                         one new [T, 128] tensor
    Paged   attention through a paged KV pool (role 'kv'): q = x as [T, 2, 64], k and v its
            first and second head (views); the call returns one new [T, 2, 64] tensor
    Ragged  the same through a ragged attention resource (role 'attn')

Each node runs on a walk of its own (kind prefill, budget T tokens and 1 sequence, one rung: T),
captured unless the spec says `capture=False` (then it runs eagerly at T). An edge (a, b) feeds
a.y into b.x, so each node takes at most one edge in. A paged pool's page is K and V for every
layer: 2 x layers x page_size tokens x 1 KV head x 64 dims x 2 B = 256 x layers x page_size B.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import graphc as gc
from resources import PagedKVSpec, RaggedAttentionSpec

HEADS, HEAD_DIM = 2, 64          # query heads on one KV head
WIDTH = HEADS * HEAD_DIM         # 128 features in and out


def page_bytes(layers: int, page_size: int = 16) -> int:
    return 2 * layers * page_size * 1 * HEAD_DIM * 2


class Dense(gc.NodeModule):
    def __init__(self, numel: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(numel))

    def forward(self, ctx, x):
        return {"y": x * 2}


class Paged(Dense):
    ROLES = {"kv": "paged_kv"}

    def forward(self, ctx, x):
        t = x.shape[0]
        q = x.view(t, HEADS, HEAD_DIM)                                 # [T, 2, 64]
        return {"y": ctx["kv"](0, q, q[:, :1], q[:, 1:2]).view(t, WIDTH)}


class Ragged(Dense):
    ROLES = {"attn": "ragged_attention"}

    def forward(self, ctx, x):
        t = x.shape[0]
        q = x.view(t, HEADS, HEAD_DIM)
        return {"y": ctx["attn"](q, q[:, :1], q[:, 1:2]).view(t, WIDTH)}


@dataclass(frozen=True)
class N:
    """One node: its weight bytes, the paged pool or ragged resource it calls, its pin."""

    name: str
    weight_bytes: int = 512
    kv: str | None = None
    attn: str | None = None
    device: int | None = None
    capture: bool = True
    tokens: int | None = None     # its walk's budget (default: build's tokens)


def pool(name: str, layers: int = 1, page_size: int = 16, max_seq_len: int = 1024, pages: int | None = None,
         fill_share: float = 1.0, int_workspace_bytes: int = 4096) -> PagedKVSpec:
    """A paged KV pool: a fill pool when pages is None. The small int workspace keeps each captured
    wrapper's buffers in the allocator's small pool."""
    return PagedKVSpec(name=name, num_layers=layers, num_qo_heads=HEADS, num_kv_heads=1, head_dim=HEAD_DIM,
                       page_size=page_size, max_seq_len=max_seq_len, pages=pages, fill_share=fill_share,
                       int_workspace_bytes=int_workspace_bytes)


def ragged(name: str) -> RaggedAttentionSpec:
    return RaggedAttentionSpec(name=name, num_heads=HEADS, head_dim=HEAD_DIM, num_kv_heads=1, max_segment=64,
                               int_workspace_bytes=4096)


def build(nodes: list[N], pools: list[PagedKVSpec] = (), edges: list[tuple[str, str]] = (),
          attns: list[RaggedAttentionSpec] = (), tokens: int = 16, name: str = "placement") -> gc.Model:
    port = gc.Port(shape=("tokens", WIDTH), dtype="bfloat16")
    decl = []
    for n in nodes:
        module = Paged if n.kv else Ragged if n.attn else Dense
        res = {"kv": n.kv} if n.kv else {"attn": n.attn} if n.attn else {}
        decl.append(gc.Node(name=n.name, module=module, config=n.weight_bytes // 2, inputs={"x": port},
                            outputs={"y": port}, resources=res, device=n.device))
    walks = [gc.Walk(name=f"w_{n.name}", kind="prefill", path=(n.name,), ladder=(n.tokens or tokens,),
                     capture=n.capture, budget=gc.Budget(tokens=n.tokens or tokens, seqs=1)) for n in nodes]
    return gc.Model(name=name, nodes=decl, resources=[*pools, *attns],
                    edges=[gc.Edge(src=f"{a}.y", dst=f"{b}.x") for a, b in edges], walks=walks)
