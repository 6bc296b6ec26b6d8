"""Small node modules for tests/unit/test_remedies.py and tests/unit/test_size_resources.py.

Each module allocates a few obvious tensors, so a test can size a model with them by hand or make
one remedy decisive. Configs are tuples (they key the compiler's memo tables by their repr).

    Enc     x [windows*16, 32] -> up [R, ffn] -> q [R, heads*64] -> ragged attention -> y [R, heads*64]
            config (ffn, heads, ballast): `ballast` bf16 parameters only add weight bytes
    Dec     x [tokens, 64] -> up [T, ffn] -> q [T, 8*D] -> one call per paged KV pool -> y [T, 512]
            config (ffn, pools, ballast, kv heads, D): the pools are bound as roles kv0, kv1, ..., each
            called with 8 query heads and the first `kv heads` of them as keys, of head dim D (64 by default)
    Blob    x [tokens, 64] -> y [tokens, 64] through one linear; config (ballast,)
    Quad    like Blob, but a step's rows must be a multiple of 4 (it folds them 4 at a time)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import graphc as gc

ROWS_PER_WINDOW = 16
FEATURES = 32
HEAD_DIM = 64
DEC_IN = 64
DEC_HEADS = 8


class _Ballast(gc.NodeModule):
    def _ballast(self, n: int) -> None:
        if n:
            self.ballast = torch.nn.Parameter(torch.zeros(n))


class Enc(_Ballast):
    ROLES = {"attn": "ragged_attention"}

    def __init__(self, cfg: tuple = (256, 2, 0)):
        super().__init__()
        ffn, self.heads, ballast = cfg
        self.up = torch.nn.Linear(FEATURES, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, self.heads * HEAD_DIM, bias=False)
        self._ballast(ballast)

    def forward(self, ctx, x):
        r = x.shape[0]
        h = F.gelu(self.up(x))                        # [R, ffn]
        q = self.down(h).view(r, self.heads, HEAD_DIM)
        del h
        o = ctx["attn"](q, q, q)                      # [R, heads, 64]
        return {"y": o.view(r, self.heads * HEAD_DIM)}


class Enc2(Enc):
    """Enc calling two ragged resources (roles attn and attn2) one after the other."""

    ROLES = {"attn": "ragged_attention", "attn2": "ragged_attention"}

    def forward(self, ctx, x):
        r = x.shape[0]
        q = self.down(F.gelu(self.up(x))).view(r, self.heads, HEAD_DIM)
        o = ctx["attn2"](ctx["attn"](q, q, q), q, q)
        return {"y": o.view(r, self.heads * HEAD_DIM)}


def _dec_class(pools: int) -> type:
    roles = {f"kv{i}": "paged_kv" for i in range(pools)}

    class Dec(_Ballast):
        ROLES = roles

        def __init__(self, cfg: tuple = (256, pools, 0, 1, HEAD_DIM)):
            super().__init__()
            ffn, _, ballast, self.kv_heads, self.head_dim = cfg
            self.up = torch.nn.Linear(DEC_IN, ffn, bias=False)
            self.down = torch.nn.Linear(ffn, DEC_HEADS * self.head_dim, bias=False)
            self._ballast(ballast)

        def forward(self, ctx, x):
            t = x.shape[0]
            h = F.gelu(self.up(x))                    # [T, ffn]
            o = self.down(h).view(t, DEC_HEADS, self.head_dim)
            del h
            for i in range(pools):                    # the pools' heads: DEC_HEADS query, kv_heads key of head_dim
                o = ctx[f"kv{i}"](0, o, o[:, :self.kv_heads], o[:, :self.kv_heads])
            return {"y": o[..., :HEAD_DIM].reshape(t, DEC_HEADS * HEAD_DIM)}

    Dec.__name__ = Dec.__qualname__ = f"Dec{pools}"
    return Dec


Dec1, Dec2, Dec3, Dec4 = (_dec_class(n) for n in (1, 2, 3, 4))


class Blob(_Ballast):
    ROLES: dict = {}

    def __init__(self, cfg: tuple = (0,)):
        super().__init__()
        self.lin = torch.nn.Linear(DEC_IN, DEC_IN, bias=False)
        self._ballast(cfg[0])

    def forward(self, ctx, x):
        return {"y": self.lin(x)}


class Quad(Blob):
    def forward(self, ctx, x):
        folded = x.view(-1, 4 * DEC_IN)            # [T/4, 4*64]: fails unless 4 divides T
        return {"y": self.lin(folded.view(x.shape[0], DEC_IN))}


def enc_node(name: str = "enc", cfg: tuple = (256, 2, 0), resources: dict | None = None, module=Enc,
             device: int | None = None) -> gc.Node:
    heads = cfg[1]
    rows = f"windows*{ROWS_PER_WINDOW}"
    return gc.Node(name=name, module=module, config=cfg, device=device,
                   inputs={"x": gc.Port(shape=(rows, FEATURES), dtype="bfloat16")},
                   outputs={"y": gc.Port(shape=(rows, heads * HEAD_DIM), dtype="bfloat16")},
                   resources=resources if resources is not None else {"attn": "attn"})


def dec_node(name: str = "dec", cfg: tuple = (256, 1, 0), pools: tuple[str, ...] = ("kv",),
             device: int | None = None, kv: tuple[int, int] = (1, HEAD_DIM)) -> gc.Node:
    """kv: the key heads and head dim its pools are declared with (the query heads are DEC_HEADS)."""
    module = (Dec1, Dec2, Dec3, Dec4)[len(pools) - 1]
    return gc.Node(name=name, module=module, config=(cfg[0], len(pools), cfg[2], *kv), device=device,
                   inputs={"x": gc.Port(shape=("tokens", DEC_IN), dtype="bfloat16")},
                   outputs={"y": gc.Port(shape=("tokens", DEC_HEADS * HEAD_DIM), dtype="bfloat16")},
                   resources={f"kv{i}": p for i, p in enumerate(pools)})


def blob_node(name: str = "blob", ballast: int = 0, module=Blob, device: int | None = None) -> gc.Node:
    return gc.Node(name=name, module=module, config=(ballast,), device=device,
                   inputs={"x": gc.Port(shape=("tokens", DEC_IN), dtype="bfloat16")},
                   outputs={"y": gc.Port(shape=("tokens", DEC_IN), dtype="bfloat16")})
