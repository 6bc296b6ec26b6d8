"""A minimal model declared with graphc's public API: one node (a small decoder-only LM written here in plain
torch), one resource (the paged KV cache its attention goes through), two walks (prefill, decode), one request
kind (t2t: text in, text out), how the engine serves it (a pipeline of one LLM stage) and a host that turns
token ids into prompts.

    graphc plan examples/declare_model.py --gpu cpu -o declared.plan     # or --gpu h100, ...
    graphc explain declared.plan
    python examples/python_api.py declared.plan --random-weights         # serve it: seeded weights, token ids

A model file is any Python file with declare(preset) -> graphc.Model (and host() to be served). The compiler
builds each node's module, traces one step of every walk at each rung of its budget, and plans the memory of
the weights, the KV pages and the captured graphs. For a model with an encoder whose rows an edge splices
into the LLM, see models/tiny_omni.py; for two chained autoregressive stages and audio, tests/shapes/chained.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import graphc as gc
from resources import PagedKVSpec


class Config(gc.Strict):
    """The node's config: the compiler hands it to the module's constructor (and records it in the plan)."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    max_seq_len: int


PRESETS = {"tiny": Config(vocab=256, hidden=128, layers=2, heads=2, kv_heads=1, head_dim=64, ffn=256,
                          max_seq_len=512)}


class Layer(nn.Module):
    def __init__(self, c: Config, index: int):
        super().__init__()
        self.index, self.c = index, c
        self.attn_norm, self.mlp_norm = nn.RMSNorm(c.hidden), nn.RMSNorm(c.hidden)
        self.q = nn.Linear(c.hidden, c.heads * c.head_dim, bias=False)
        self.kv = nn.Linear(c.hidden, 2 * c.kv_heads * c.head_dim, bias=False)
        self.o = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)
        self.up = nn.Linear(c.hidden, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x: torch.Tensor, attend) -> torch.Tensor:
        t, c = x.shape[0], self.c
        h = self.attn_norm(x)
        k, v = self.kv(h).view(t, 2, c.kv_heads, c.head_dim).unbind(1)
        # the paged KV resource appends this step's k, v to each sequence's pages and attends causally
        o = attend(self.index, self.q(h).view(t, c.heads, c.head_dim), k, v)       # [T, heads, head_dim]
        x = x + self.o(o.reshape(t, -1))
        return x + self.down(F.silu(self.up(self.mlp_norm(x))))


class TinyLM(gc.NodeModule):
    """Token ids of a step's rows (every sequence's rows, packed), their positions and the rows to sample ->
    logits of those rows. Its one role, 'kv', is a paged KV cache; the node binds it to a declared resource."""

    ROLES = {"kv": "paged_kv"}

    def __init__(self, c: Config):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.pos = nn.Embedding(c.max_seq_len, c.hidden)              # learned positions
        self.layers = nn.ModuleList(Layer(c, i) for i in range(c.layers))
        self.norm = nn.RMSNorm(c.hidden)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)

    def forward(self, ctx: gc.StepContext, token_ids: torch.Tensor, positions: torch.Tensor,
                sample_rows: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.embed(token_ids) + self.pos(positions)
        for layer in self.layers:
            x = layer(x, ctx["kv"])
        return {"logits": self.lm_head(self.norm(x.index_select(0, sample_rows))).float()}


def declare(preset: str = "tiny") -> gc.Model:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; presets: {', '.join(PRESETS)}")
    c = PRESETS[preset]
    # a port's dims are ints or a capture axis ('tokens', 'seqs', ...): the compiler picks each walk's rungs
    lm = gc.Node(name="lm", module=TinyLM, config=c, resources={"kv": "kv_cache"},
                 inputs={"token_ids": gc.Port(shape=("tokens",), dtype="int64"),
                         "positions": gc.Port(shape=("tokens",), dtype="int64"),
                         "sample_rows": gc.Port(shape=("seqs",), dtype="int64")},
                 outputs={"logits": gc.Port(shape=("seqs", c.vocab), dtype="float32")})
    return gc.Model(
        name=f"declared-{preset}",
        nodes=[lm],
        resources=[PagedKVSpec(name="kv_cache", num_layers=c.layers, num_qo_heads=c.heads, num_kv_heads=c.kv_heads,
                               head_dim=c.head_dim, page_size=16, max_seq_len=c.max_seq_len, pages=128)],
        walks=[  # what one engine step may carry: at most 128 prompt tokens of 4 sequences, or 16 decode rows
            gc.Walk(name="prefill", kind="prefill", path=("lm",), budget=gc.Budget(tokens=128, seqs=4)),
            gc.Walk(name="decode", kind="decode", path=("lm",), budget=gc.Budget(seqs=16)),
        ],
        requests=[gc.RequestKind(name="t2t", stages=("prefill", "decode"))],
        pipeline=gc.Pipeline(stages=(gc.LLMStage(name="text", node="lm", decode="decode", prefill=("prefill",)),)),
    )


class Host(gc.Host):
    """Prompts of text token ids at positions 0, 1, ...; no media (so no encoder step ever runs)."""

    eos_token_ids = ()

    def prompt(self, ids: list[int], media: list[gc.Media]) -> gc.Prompt:
        if media:
            raise gc.InvalidInput(f"this model takes no media ({len(media)} item(s) given)", "it has no encoder",
                                  "send text only")
        return gc.Prompt(ids=list(ids), positions=torch.arange(len(ids))[None], delta=0)

    def encode(self, node: str, pieces: list, units: int):
        raise gc.InvalidInput(f"this model has no encoder, yet node {node} was asked to encode", "", "")


def host(model: gc.Model, checkpoint: str | None = None) -> Host:
    """What `graphc run` and graphc.Engine serve the plan through (graphc/serving.py)."""
    return Host()
