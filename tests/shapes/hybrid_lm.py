"""A hybrid language model for the compiler's linear_state tests: Gated DeltaNet layers, whose state lives in
a linear_state resource's slots, and one softmax attention layer through a paged KV pool, in the 3:1
pattern of Qwen3.5. Written against graphc's public API, resources and models' components only.

Presets: "tiny" (the CPU tests), and "wide" (state slots of a few MiB each, for the ledger's trade between
state slots and KV pages on a GPU target).
"""
from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

import graphc as gc
from models.components.gated_deltanet import GatedDeltaNet
from models.components.gated_deltanet_config import GatedDeltaNetConfig, state_spec
from resources import PagedKVSpec
from tests.shapes.chained import Block, RMSNorm, rotary


class HybridConfig(gc.Strict):
    vocab: int = Field(ge=2)
    linear: GatedDeltaNetConfig
    blocks: int = Field(ge=1)          # each: three linear-attention layers, then one attention layer
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=2)
    ffn: int = Field(ge=1)
    max_seq_len: int = Field(ge=1)
    rope_theta: float = 10000.0
    eps: float = 1e-6


def _config(hidden: int, heads: int, vocab: int, blocks: int) -> HybridConfig:
    linear = GatedDeltaNetConfig(hidden_size=hidden, linear_num_key_heads=heads, linear_num_value_heads=2 * heads,
                                 linear_key_head_dim=hidden // heads, linear_value_head_dim=hidden // heads)
    return HybridConfig(vocab=vocab, linear=linear, blocks=blocks, heads=heads, kv_heads=max(heads // 2, 1),
                        head_dim=hidden // heads, ffn=2 * hidden, max_seq_len=256)


PRESETS = {
    "tiny": dict(config=_config(32, 2, 64, 2), page_size=8, pages=128, prefill_tokens=64, prefill_seqs=4,
                 decode_seqs=8, dtype="float32", state_dtype="float32"),
    "wide": dict(config=_config(1024, 8, 4096, 2), page_size=16, prefill_tokens=512, prefill_seqs=8, decode_seqs=64,
                 dtype="bfloat16", state_dtype="float32"),
}


class HybridLM(gc.NodeModule):
    """token_ids [T], positions [T], sample_rows [S] -> logits [S, V] (fp32)."""

    ROLES = {"kv": "paged_kv", "state": "linear_state"}

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.linear.hidden_size)
        self.linear = nn.ModuleList(GatedDeltaNet(cfg.linear, i) for i in range(3 * cfg.blocks))
        self.attention = nn.ModuleList(Block(cfg.linear.hidden_size, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn,
                                             cfg.eps, i) for i in range(cfg.blocks))
        self.norm = RMSNorm(cfg.linear.hidden_size, cfg.eps)
        self.lm_head = nn.Linear(cfg.linear.hidden_size, cfg.vocab, bias=False)

    def forward(self, ctx: gc.StepContext, token_ids: torch.Tensor, positions: torch.Tensor,
                sample_rows: torch.Tensor) -> dict[str, torch.Tensor]:
        kv, state = ctx["kv"], ctx["state"]
        x = self.embed(token_ids)
        rope = rotary(positions, self.cfg.head_dim, self.cfg.rope_theta)
        for b, block in enumerate(self.attention):
            for layer in self.linear[3 * b:3 * b + 3]:
                x = x + layer(x, state)
            x = block(x, kv, rope)
        return {"logits": self.lm_head(self.norm(x).index_select(0, sample_rows)).float()}


def declare(preset: str = "tiny") -> gc.Model:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; presets: {', '.join(PRESETS)}")
    p = PRESETS[preset]
    c: HybridConfig = p["config"]
    port = gc.Port
    node = gc.Node(name="lm", module=HybridLM, config=c, dtype=p["dtype"], resources={"kv": "lm_kv", "state": "lm_state"},
                   inputs={"token_ids": port(shape=("tokens",), dtype="int64"),
                           "positions": port(shape=("tokens",), dtype="int64"),
                           "sample_rows": port(shape=("seqs",), dtype="int64")},
                   outputs={"logits": port(shape=("seqs", c.vocab), dtype="float32")})
    kv = PagedKVSpec(name="lm_kv", num_layers=c.blocks, num_qo_heads=c.heads, num_kv_heads=c.kv_heads,
                     head_dim=c.head_dim, page_size=p["page_size"], max_seq_len=c.max_seq_len, dtype=p["dtype"],
                     pages=p.get("pages"))
    state = state_spec(c.linear, "lm_state", 3 * c.blocks, conv_dtype=p["dtype"], state_dtype=p["state_dtype"])
    return gc.Model(
        name=f"hybrid-{preset}", nodes=[node], resources=[kv, state],
        walks=[gc.Walk(name="prefill", kind="prefill", path=("lm",), capture=False,
                       budget=gc.Budget(tokens=p["prefill_tokens"], seqs=p["prefill_seqs"])),
               gc.Walk(name="decode", kind="decode", path=("lm",), budget=gc.Budget(seqs=p["decode_seqs"]))],
        requests=[gc.RequestKind(name="t2t", stages=("prefill", "decode"))],
        pipeline=gc.Pipeline(stages=(gc.LLMStage(name="write", node="lm", decode="decode", prefill=("prefill",)),)),
    )


def host(model: gc.Model, checkpoint: str | None = None):
    """Text only: 1-D positions, no encoders, no end-of-turn id (greedy runs to max_tokens)."""
    from models.components.hosting import AudioVisualHost, Encoders, random_media_tokens

    vocab = model.node("lm").config.vocab
    return AudioVisualHost(model, "lm", Encoders(), random_media_tokens(vocab), mrope=False, eos_token_ids=())
