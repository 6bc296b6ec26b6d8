"""A model for tests/unit/test_tally_ledger.py: four independent nodes, each on a walk of its own,
so that what a device holds can be read off the subset of nodes it is given.

    a   Conv: a 1-D convolution over 4 channels (kernel 3, padding 1, bias); walk `wa`, budget 32
        tokens, ladder (8,), captured only up to 8 (capture_limit): one graph at 8, one eager step at 32
    b   Conv over 16 channels; walk `wb`, budget 16 tokens, ladder (8,): graphs at 8 and 16, no eager step
    p   Paged: attention through the paged KV pool `kv` (2 query heads on 1 KV head, head dim 64, no
        declared workspace, so the compiler sizes a one-slot float workspace for it); walk `wp`,
        budget 16 tokens and 1 sequence, one graph at 16
    r   Ragged: attention through the ragged resource `vis` (1 head, head dim 128, no declared
        workspace); walk `wr`, budget 16 tokens, one graph at 16

One step of T tokens of a or b allocates the convolution's output [1, C, T] and its contiguous
copy [T, C] (bf16, 2*C*T B each; the transposes are views): peak 4*C*T B, 2 kernel launches. One
step of p or r allocates the attention call's output (bf16 [T, 2, 64] or [T, 1, 128], 256*T B):
1 launch.

A convolution's signature (graphc/simulate.py) names its input and weight shapes, so a's and b's
convolutions differ at every size, and a's eager step (32 tokens) differs from its graph (8):

    a graph:  conv x[1,4,8]  w[4,4,3] bfloat16 bias s1 p1 d1 op0 g1
    a eager:  conv x[1,4,32] w[4,4,3] bfloat16 bias s1 p1 d1 op0 g1
    b graphs: conv x[1,16,8] w[16,16,3] ..., conv x[1,16,16] w[16,16,3] ...

None of them is in graphc/conv_workspaces.yaml. On sm_90 (capabilities.py): paged prefill runs
fa3, paged decode fa2 (a GQA group of 2 < 5: the CUDA-core decode kernel), ragged prefill fa3.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import graphc as gc
from resources import PagedKVSpec, RaggedAttentionSpec

CA, CB = 4, 16                # channels of a's and b's convolutions
HEADS, HEAD_DIM = 2, 64       # p: query heads x head dim, on one KV head
R_HEAD_DIM = 128              # r: one head of 128


def conv_sig(channels: int, tokens: int) -> str:
    return f"conv x[1,{channels},{tokens}] w[{channels},{channels},3] bfloat16 bias s1 p1 d1 op0 g1"


class Conv(gc.NodeModule):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = torch.nn.Conv1d(channels, channels, 3, padding=1)

    def forward(self, ctx, x):                                # x [T, C]
        y = F.conv1d(x.t().unsqueeze(0), self.conv.weight, self.conv.bias, padding=1)   # [1, C, T]
        return {"y": y[0].t().contiguous()}                  # [T, C]


class Paged(gc.NodeModule):
    ROLES = {"kv": "paged_kv"}

    def __init__(self, width: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(width))

    def forward(self, ctx, x):
        t = x.shape[0]
        q = x.view(t, HEADS, HEAD_DIM)                                    # [T, 2, 64]
        return {"y": ctx["kv"](0, q, q[:, :1], q[:, 1:2]).view(t, HEADS * HEAD_DIM)}


class Ragged(gc.NodeModule):
    ROLES = {"attn": "ragged_attention"}

    def __init__(self, width: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(width))

    def forward(self, ctx, x):
        t = x.shape[0]
        q = x.view(t, 1, R_HEAD_DIM)                                      # [T, 1, 128]
        return {"y": ctx["attn"](q, q, q).view(t, R_HEAD_DIM)}


def declare(preset: str = "tally") -> gc.Model:
    if preset != "tally":
        raise ValueError(f"unknown preset '{preset}'; presets: tally")

    def port(width: int) -> dict:
        return {"x": gc.Port(shape=("tokens", width), dtype="bfloat16")}

    def out(width: int) -> dict:
        return {"y": gc.Port(shape=("tokens", width), dtype="bfloat16")}

    return gc.Model(
        name="tally",
        nodes=[gc.Node(name="a", module=Conv, config=CA, inputs=port(CA), outputs=out(CA)),
               gc.Node(name="b", module=Conv, config=CB, inputs=port(CB), outputs=out(CB)),
               gc.Node(name="p", module=Paged, config=HEADS * HEAD_DIM, inputs=port(HEADS * HEAD_DIM),
                       outputs=out(HEADS * HEAD_DIM), resources={"kv": "kv"}),
               gc.Node(name="r", module=Ragged, config=R_HEAD_DIM, inputs=port(R_HEAD_DIM),
                       outputs=out(R_HEAD_DIM), resources={"attn": "vis"})],
        resources=[PagedKVSpec(name="kv", num_layers=1, num_qo_heads=HEADS, num_kv_heads=1, head_dim=HEAD_DIM,
                               page_size=16, max_seq_len=256),
                   RaggedAttentionSpec(name="vis", num_heads=1, head_dim=R_HEAD_DIM, max_segment=16)],
        walks=[gc.Walk(name="wa", kind="prefill", path=("a",), ladder=(8,), capture_limit={"a": 8},
                       budget=gc.Budget(tokens=32, seqs=1)),
               gc.Walk(name="wb", kind="prefill", path=("b",), ladder=(8,), budget=gc.Budget(tokens=16, seqs=1)),
               gc.Walk(name="wp", kind="prefill", path=("p",), ladder=(16,), budget=gc.Budget(tokens=16, seqs=1)),
               gc.Walk(name="wr", kind="prefill", path=("r",), ladder=(16,), budget=gc.Budget(tokens=16, seqs=1))],
    )
