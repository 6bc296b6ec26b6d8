"""A pre-LN bidirectional transformer over ragged segments (windows or frames), as a node.

The tiny models' encoder; the AuT and ViT encoders reuse its layer shape (LayerNorm, biased
q/k/v/out projections, GELU FFN).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graphc import NodeModule, StepContext
from models.components.encoder_config import EncoderConfig


class EncoderAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.h, self.d = heads, dim // heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, attn) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.h, self.d)
        k = self.k_proj(x).view(t, self.h, self.d)
        v = self.v_proj(x).view(t, self.h, self.d)
        return self.out_proj(attn(q, k, v).reshape(t, self.h * self.d))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        d = cfg.hidden_size
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.self_attn = EncoderAttention(d, cfg.num_heads)
        self.final_layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.fc1 = nn.Linear(d, cfg.ffn_dim)
        self.fc2 = nn.Linear(cfg.ffn_dim, d)

    def forward(self, x: torch.Tensor, attn) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), attn)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class WindowEncoder(NodeModule):
    """Node: features [R, input_dim] packed by segment -> embeds [R, output_dim]."""

    ROLES = {"attn": "ragged_attention"}

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.in_proj = nn.Linear(cfg.input_dim, cfg.hidden_size)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_layers))
        self.ln_post = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.proj = nn.Linear(cfg.hidden_size, cfg.output_dim)

    def forward(self, ctx: StepContext, features: torch.Tensor) -> dict[str, torch.Tensor]:
        attn = ctx["attn"]
        x = self.in_proj(features)
        for layer in self.layers:
            x = layer(x, attn)
        return {"embeds": self.proj(self.ln_post(x))}
