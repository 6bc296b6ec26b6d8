"""A model small enough that every byte of its plan can be computed by hand (tests/unit/test_ledger_oracle.py).

One node, `mlp`, with one paged KV resource and a declared two-slot float workspace. Its forward
allocates few, large and obvious tensors, so the capture pool and the eager activations follow
from the caching allocator's rules with pencil arithmetic:

    x [T, 64] (static input, not allocated by the step)
    h = up(x)          [T, F]   bf16  2*T*F B   (mm)
    g = gelu(h)        [T, F]   bf16  2*T*F B   (gelu)      h dies
    y = down(g)        [T, 512] bf16  1024*T B  (mm)        g dies
    o = kv(0, y as [T, 8, 64])  [T, 8, 64]  1024*T B  (the fake paged call: one new tensor)  y dies
    o = kv(1, o)       [T, 8, 64]  1024*T B                  the layer-0 output dies
    return o as [T, 512]        (dies when the caller drops it)

Five kernel launches per step (mm, gelu, mm, and one per attention call); views (t, view, slice)
launch none. Only contiguous views: no reshape of a non-contiguous tensor, no 3-D matmul (whose
folding goes through aten._unsafe_view).

Presets vary only what the xfail tests need: 'oracle' (default; 8 query heads on 1 kv head, a
GQA group of 8, so decode runs on FlashInfer's tensor-core path), 'cuda_core' (8 on 2: group 4,
the CUDA-core decode kernel) and 'split_seqs' (the two walks of the prefill family budget
different sequence counts).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import graphc as gc
from resources import PagedKVSpec, WorkspaceSpec

D_IN = 64                 # input features
FFN = 1 << 20             # F: the wide hidden layer, so activations are MiB-sized
HEADS, HEAD_DIM = 8, 64   # query heads x head dim = 512 output features
LAYERS = 2                # attention calls per step = layers of the KV pool
PAGE_SIZE = 16
MAX_SEQ_LEN = 1024        # 64 pages for the longest request
WORKSPACE_BYTES = 16 << 20

PRESETS = {
    "oracle": dict(kv_heads=1, prefill_seqs=2, mixed_seqs=2),
    "cuda_core": dict(kv_heads=2, prefill_seqs=2, mixed_seqs=2),
    "split_seqs": dict(kv_heads=1, prefill_seqs=1, mixed_seqs=4),
}


class OracleMLP(gc.NodeModule):
    ROLES = {"kv": "paged_kv"}

    def __init__(self, kv_heads: int = 1):
        super().__init__()
        self.kv_heads = kv_heads
        self.up = torch.nn.Linear(D_IN, FFN, bias=False)                  # [F, 64]
        self.down = torch.nn.Linear(FFN, HEADS * HEAD_DIM, bias=False)   # [512, F]
        # unused by the forward; here so the arena's 256-B alignment shows: 200 B and 12 B
        self.scale = torch.nn.Parameter(torch.ones(100))                   # bf16 like every parameter
        self.register_buffer("offsets", torch.zeros(3))                    # buffers keep float32

    def forward(self, ctx, x):
        t, kvh = x.shape[0], self.kv_heads
        h = self.up(x)                       # [T, F]
        g = F.gelu(h)                        # [T, F]
        del h
        y = self.down(g)                     # [T, 512]
        del g
        o = y.view(t, HEADS, HEAD_DIM)       # [T, 8, 64], a view of y
        del y
        for layer in range(LAYERS):
            # k, v: the first kv heads' worth of query heads (views); the call returns a new tensor
            o = ctx["kv"](layer, o, o[:, :kvh], o[:, kvh:2 * kvh])
        return {"y": o.view(t, HEADS * HEAD_DIM)}


def declare(preset: str = "oracle") -> gc.Model:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; presets: {', '.join(PRESETS)}")
    p = PRESETS[preset]
    return gc.Model(
        name=f"oracle-{preset}",
        nodes=[gc.Node(name="mlp", module=OracleMLP, config=p["kv_heads"],
                       inputs={"x": gc.Port(shape=("tokens", D_IN), dtype="bfloat16")},
                       outputs={"y": gc.Port(shape=("tokens", HEADS * HEAD_DIM), dtype="bfloat16")},
                       resources={"kv": "cache"})],
        resources=[
            PagedKVSpec(name="cache", num_layers=LAYERS, num_qo_heads=HEADS, num_kv_heads=p["kv_heads"],
                        head_dim=HEAD_DIM, page_size=PAGE_SIZE, max_seq_len=MAX_SEQ_LEN, workspace="ws"),
            WorkspaceSpec(name="ws", bytes=WORKSPACE_BYTES, slots=2),
        ],
        walks=[
            # prefill and mixed share the graph family prefill:tokens, which captures the union of
            # their rungs: 8 and 24 from prefill, 8 and 16 from mixed (cut at its capture_limit)
            gc.Walk(name="prefill", kind="prefill", path=("mlp",), ladder=(8,),
                    budget=gc.Budget(tokens=24, seqs=p["prefill_seqs"])),
            gc.Walk(name="mixed", kind="mixed", path=("mlp",), ladder=(8, 16), capture_limit={"mlp": 16},
                    budget=gc.Budget(tokens=32, seqs=p["mixed_seqs"])),
            gc.Walk(name="decode", kind="decode", path=("mlp",), budget=gc.Budget(seqs=4)),
        ],
        requests=[gc.RequestKind(name="t2t", stages=("prefill", "decode"))],
    )
