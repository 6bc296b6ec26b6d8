"""Qwen3-Omni's thinker text model as a serving node: MoE decoder, M-RoPE, encoder splice, deepstack.

Weight names (minus the node's weight_prefix, 'thinker.' in the real checkpoint): model.embed_tokens,
model.layers.N.{input_layernorm, self_attn.{qkv,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm,
mlp.gate, mlp.experts.{gate_up_proj, down_proj}}, model.norm, lm_head (qkv_proj stacks the checkpoint's q_proj,
k_proj and v_proj, and the experts its per-expert matrices, at load). The real checkpoint also holds
thinker.audio_tower.* and thinker.visual.* under the same prefix: those belong to the encoder nodes.

One step carries packed rows of several sequences (prefill chunks and decode rows alike); attention goes
through the paged role "kv". Encoder rows enter through index inputs, so shapes stay static:
  audio group:  audio_embeds [A, H] (the audio encoder's rows), audio_rows [T] = row of audio_embeds
                for each token row, -1 for rows that keep their token embedding;
  visual group: visual_embeds [V, H] (image and video merger rows, in any order), visual_rows [T] likewise,
                deepstack [K, V, H] (the K deepstack mergers' rows, aligned with visual_embeds), added to the
                visual rows after decoder layers 0..K-1 (HF's deepstack; images and videos share one mask).
Host-side metadata (positions from mrope.rope_index, row indices, sample_rows) is computed outside forward.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from graphc import NodeModule, StepContext
from models.components.layers import Linear, RMSNorm, add_at, norm_rope_qk, rope_inv_freq, splice, split_qkv
from models.components.moe import SparseMoE
from models.components.mrope import mrope_cos_sin, mrope_slots
from models.components.thinker_config import THINKER_30B_A3B, MoETextConfig, ThinkerConfig, thinker_ports  # noqa: F401

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Attention(nn.Module):
    """Qwen3 attention with RMS qk-norm over head_dim; rows may carry any leading shape ([T] or [S, n])."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        self.h, self.kv, self.d = heads, kv_heads, head_dim
        # q's, k's and v's rows in one matrix (one GEMM; the checkpoint's {q,k,v}_proj are stacked at load)
        self.qkv_proj = Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.o_proj = Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def forward(self, x: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, attend: Attend,
                qkv: torch.Tensor | None = None) -> torch.Tensor:
        """qkv: qkv_proj's output rows where the caller computed them (FoldedLayer's norm_gemv), x then unused.
        Computed here, they are freed once q, k and v are written elsewhere (the frame cache's slots)."""
        rows = (x if qkv is None else qkv).shape[:-1]
        q, k, v = split_qkv(self.qkv_proj(x) if qkv is None else qkv, self.h, self.kv, self.d)
        fused = getattr(attend, "fused", None)      # an attend that norms, rotates and attends in one launch
        if fused is not None:
            return self.o_proj(fused(self.q_norm, self.k_norm, q, k, v, cos, sin).reshape(*rows, self.h * self.d))
        # an attend that keeps q, k and v (the code predictor's frame cache) names where: written there in place
        out = getattr(attend, "qkv_out", None)
        if out is None:
            q, k = norm_rope_qk(self.q_norm, self.k_norm, q, k, cos, sin)
        else:
            q, k, v = norm_rope_qk(self.q_norm, self.k_norm, q, k, cos, sin, out, v)
        return self.o_proj(attend(q, k, v).reshape(*rows, self.h * self.d))



class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention, then the given feed-forward (sparse MoE or SwiGLU)."""

    def __init__(self, hidden: int, attn: Attention, mlp: nn.Module, eps: float):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = attn
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = mlp

    def attention(self, x: torch.Tensor, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual x, its input norm h -> (x + attention, the post-attention norm of that)."""
        return self.post_attention_layernorm.add(x, self.self_attn(h, cos, sin, attend))

    def forward(self, x: torch.Tensor, h: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, attend: Attend,
                norm: RMSNorm | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x -> (the layer's output, norm of it where norm, the next layer's input norm, is given); h: this layer's
        input norm of x where the layer before computed it (None: computed here). With a sparse MoE the residual
        add rides in the experts' last launch, and the next norm with it where the kernels allow
        (SparseMoE.add_norm)."""
        x, h = self.attention(x, self.input_layernorm(x) if h is None else h, cos, sin, attend)
        if isinstance(self.mlp, SparseMoE):
            return self.mlp.add_norm(h, x, norm)
        return (x + self.mlp(h), None) if norm is None else norm.add(x, self.mlp(h))


def next_norm(layers: nn.ModuleList, i: int) -> RMSNorm | None:
    """The input norm of the layer after layers[i] (None after the last), for DecoderLayer.forward."""
    return layers[i + 1].input_layernorm if i + 1 < len(layers) else None


class FoldedLayer(DecoderLayer):
    """A DecoderLayer whose last residual add is left to the next norm: (x, delta) -> (x', delta'), its input
    being x + delta (delta None: x alone) and its output x' + delta'. The add runs inside the next layer's
    input norm, or the stack's final norm (RMSNorm.add: one launch where fused), not as a launch of its own;
    the sums are the same bf16 roundings as DecoderLayer's, in the same order. For a stack of dense layers
    (an MoE layer's add already rides in its experts' last launch)."""

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                attend: Attend) -> tuple[torch.Tensor, torch.Tensor]:
        """Each norm (and the residual add before it) runs in its own launch, or in the product after it where
        the plan's norm_gemv knob folds it there (_folded)."""
        norm = self.input_layernorm
        if self.self_attn.qkv_proj.folds(norm, x, delta):
            return self._folded(x, delta, cos, sin, attend)
        x, h = self.attention(*((x, norm(x)) if delta is None else norm.add(x, delta)), cos, sin, attend)
        return x, self.mlp(h)

    def _folded(self, x: torch.Tensor, delta: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                attend: Attend) -> tuple[torch.Tensor, torch.Tensor]:
        """The input norm in the q/k/v product's launch, the post-attention add and norm in the MLP's first
        (Linear.after_norm, SwiGLU.after_norm: its own launch where the MLP's product cannot take it)."""
        attn = self.self_attn
        x, qkv = attn.qkv_proj.after_norm(x, delta, self.input_layernorm)
        return self.mlp.after_norm(x, attn(None, cos, sin, attend, qkv), self.post_attention_layernorm)


def moe_layer(cfg: MoETextConfig, shared_intermediate: int = 0) -> DecoderLayer:
    attn = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                     cfg.rms_norm_eps)
    mlp = SparseMoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                    cfg.norm_topk_prob, shared_intermediate)
    return DecoderLayer(cfg.hidden_size, attn, mlp, cfg.rms_norm_eps)


class MRope(nn.Module):
    """Interleaved M-RoPE tables: non-persistent fp32 inverse frequencies and the slot-to-axis map."""

    def __init__(self, head_dim: int, theta: float, mrope_section: tuple[int, int, int]):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta), persistent=False)
        self.register_buffer("slots", mrope_slots(head_dim, mrope_section), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return mrope_cos_sin(positions, self.inv_freq, self.slots, dtype)


class ThinkerBody(nn.Module):
    def __init__(self, cfg: ThinkerConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(moe_layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Thinker(NodeModule):
    """Node: token rows (+ spliced encoder rows) -> logits of the rows to sample.

    Inputs: token_ids [T] int64, positions [3, T] int64, sample_rows [S] int64; optional group 'audio':
    audio_embeds [A, H], audio_rows [T] int64; optional group 'visual': visual_embeds [V, H],
    visual_rows [T] int64, deepstack [K, V, H]. Outputs: logits [S, vocab] fp32; with accept_hidden_layer
    set, also embeds [T, H] and hidden [T, H] in the node's dtype.
    """

    ROLES = {"kv": "paged_kv"}

    def __init__(self, cfg: ThinkerConfig):
        super().__init__()
        self.cfg = cfg
        self.model = ThinkerBody(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = MRope(cfg.head_dim, cfg.rope_theta, cfg.mrope_section)

    def embed(self, token_ids: torch.Tensor, audio_embeds: torch.Tensor | None, audio_rows: torch.Tensor | None,
              visual_embeds: torch.Tensor | None, visual_rows: torch.Tensor | None) -> torch.Tensor:
        x = self.model.embed_tokens(token_ids)                                 # [T, H]
        if audio_embeds is not None:
            x = splice(x, audio_embeds, audio_rows)
        if visual_embeds is not None:
            x = splice(x, visual_embeds, visual_rows)
        return x

    def forward(self, ctx: StepContext, token_ids: torch.Tensor, positions: torch.Tensor,
                sample_rows: torch.Tensor, audio_embeds: torch.Tensor | None = None,
                audio_rows: torch.Tensor | None = None, visual_embeds: torch.Tensor | None = None,
                visual_rows: torch.Tensor | None = None, deepstack: torch.Tensor | None = None
                ) -> dict[str, torch.Tensor]:
        kv = ctx["kv"]
        x = self.embed(token_ids, audio_embeds, audio_rows, visual_embeds, visual_rows)
        out = {"embeds": x} if self.cfg.accept_hidden_layer is not None else {}
        cos, sin, h = *self.rope(positions, x.dtype), None
        for i, layer in enumerate(self.model.layers):
            stacked = deepstack is not None and i < deepstack.shape[0]       # rows change before the next norm
            x, h = layer(x, h, cos, sin, partial(kv, i), None if stacked else next_norm(self.model.layers, i))
            if i + 1 == self.cfg.accept_hidden_layer:
                out["hidden"] = x
            if stacked:
                x = add_at(x, deepstack[i], visual_rows)
        x = self.model.norm(x.index_select(0, sample_rows))                   # [S, H]
        out["logits"] = self.lm_head(x).float()
        return out
