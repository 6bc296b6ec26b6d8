"""The dense Qwen3 decoder (qk-norm, rotary, SwiGLU) as a serving node over a paged KV resource.

Used by Qwen3-ASR's text model and by the tiny models. Weight names follow HF's Qwen3:
model.embed_tokens, model.layers.N.{self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.*,
input_layernorm, post_attention_layernorm}, model.norm, lm_head.
"""
from __future__ import annotations

import torch
from torch import nn

from graphc import NodeModule, StepContext
from models.components.layers import Linear, RMSNorm, SwiGLU, norm_rope_qk, rope_cos_sin, rope_inv_freq, splice, \
    split_qkv
from models.components.qwen3_dense_config import Qwen3Config, lm_ports  # noqa: F401


class Qwen3Attention(nn.Module):
    def __init__(self, cfg: Qwen3Config, layer: int):
        super().__init__()
        self.layer, self.h, self.kv, self.d = layer, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # q's, k's and v's rows in one matrix (one GEMM; the checkpoint's {q,k,v}_proj are stacked at load)
        self.qkv_proj = Linear(cfg.hidden_size, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = split_qkv(self.qkv_proj(x), self.h, self.kv, self.d)
        q, k = norm_rope_qk(self.q_norm, self.k_norm, q, k, cos, sin)                  # [T, H or KV, D]
        o = kv(self.layer, q, k, v)                                                     # [T, H, D]
        return self.o_proj(o.reshape(t, self.h * self.d))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Qwen3Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv) -> torch.Tensor:
        x, h = self.post_attention_layernorm.add(x, self.self_attn(self.input_layernorm(x), cos, sin, kv))
        return x + self.mlp(h)


class Qwen3Body(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen3LM(NodeModule):
    """Node: token ids (+ optional spliced encoder rows) -> logits of the rows to sample.

    Inputs: token_ids [T], positions [T], sample_rows [S]; optional group 'mm': mm_embeds [M, D]
    (an encoder's output rows) and mm_rows [T] (index into mm_embeds, -1 for text rows).
    Output: logits [S, V] in fp32.
    """

    ROLES = {"kv": "paged_kv"}

    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.cfg = cfg
        self.model = Qwen3Body(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    @property
    def body(self) -> Qwen3Body:
        return self.model

    def embed(self, token_ids: torch.Tensor, mm_embeds: torch.Tensor | None, mm_rows: torch.Tensor | None
              ) -> torch.Tensor:
        x = self.body.embed_tokens(token_ids)                         # [T, D]
        return x if mm_embeds is None else splice(x, mm_embeds, mm_rows)

    def forward(self, ctx: StepContext, token_ids: torch.Tensor, positions: torch.Tensor,
                sample_rows: torch.Tensor, mm_embeds: torch.Tensor | None = None,
                mm_rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        kv = ctx["kv"]
        x = self.embed(token_ids, mm_embeds, mm_rows)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        for layer in self.body.layers:
            x = layer(x, cos, sin, kv)
        x = self.body.norm(x.index_select(0, sample_rows))             # [S, D]
        return {"logits": self.lm_head(x).float()}


class Qwen3LMNested(Qwen3LM):
    """Qwen3LM with its decoder at model.language_model (transformers' multimodal layout, e.g. the
    Qwen3-ASR "-hf" checkpoints: model.language_model.*, lm_head)."""

    def __init__(self, cfg: Qwen3Config):
        NodeModule.__init__(self)
        self.cfg = cfg
        self.model = nn.Module()
        self.model.language_model = Qwen3Body(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.language_model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    @property
    def body(self) -> Qwen3Body:
        return self.model.language_model
