"""The Qwen3.5 text decoder as a serving node: Gated DeltaNet layers over state slots, gated full attention over
paged KV, after each a dense SwiGLU MLP (qwen3_5) or a sparse MoE block with a gated shared expert (qwen3_5_moe:
models/components/moe.py's SparseMoE, HF's Qwen3_5MoeSparseMoeBlock).

Per layer (config.layer_types): "linear_attention" -> GatedDeltaNet (gated_deltanet.py) on ctx["state"] at its index
among the linear layers; "full_attention" -> GatedAttention on ctx["kv"] at its index among the full layers. Every
RMSNorm here is zero-centred (x_normed * (1 + w): input/post-attention layernorms, q_norm, k_norm, the final norm)
except the GDN output norm, which is plain. Weight names are a checkpoint's text weights
(model.language_model.{embed_tokens, layers.N.{linear_attn, self_attn, mlp, input_layernorm,
post_attention_layernorm}, norm}, lm_head; lm_head absent when tied); mtp.* and model.visual.* are not this node's.
A MoE layer's mlp is {gate (the router), experts.{gate_up_proj [E, 2I, H], down_proj [E, H, I]}, shared_expert.
{gate,up,down}_proj, shared_expert_gate}: the experts load fused as the published checkpoints store them, or per
expert (experts.N.{gate,up,down}_proj, as HF's Qwen3_5MoeForCausalLM saves them), graphc/runtime/checkpoint.py.

Tensor parallel (a config from rank_part(tp), cfg.tp > 1): the module is one rank's part, its attention, KV and GDN
heads and its MLP widths (experts' and shared expert's) 1/tp of the whole; tp_splits() says which rows or columns
of each disk tensor a rank loads. The row-parallel projections (o_proj, out_proj, down_proj; the experts' and the
shared expert's down projections) give partial sums: each layer calls ctx.reduce twice, on the mixer's output and
on the MLP's, before the residual adds. Embeddings, the LM head, the router, shared_expert_gate and every norm are
whole on every rank.
"""
from __future__ import annotations

import torch
from torch import nn

from graphc import NodeModule, Split, StepContext
from models.components import norm_ops
from models.components.gated_deltanet import GatedDeltaNet
from models.components.layers import Linear, RMSNorm, SwiGLU, apply_rope, rope_inv_freq, splice
from models.components.moe import SparseMoE
from models.components.mrope import mrope_cos_sin, mrope_slots
from models.components.qwen3_5_text_config import Qwen3_5MoeTextConfig, Qwen3_5TextConfig, qwen3_5_ports  # noqa: F401


class ZeroCentredRMSNorm(RMSNorm):
    """rmsnorm(x) * (1 + w) in fp32, cast to x's dtype (HF's Qwen3_5RMSNorm; the checkpoint stores w near 0), over
    x [..., D] (q_norm and k_norm: each head's row of [T, H, D]). The plain norm's kernels (fused_norms) scale by
    w, not 1 + w: under the gdn_fused knob bf16 rows on a kernel device take zc_rms_norm (and add,
    add_zc_rms_norm), one launch each (norm_ops.py); else the torch path."""

    gdn_fused: int = 0        # the plan's knob (graphc/modules.py KERNEL_KNOBS)

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__(dim, eps)
        nn.init.zeros_(self.weight)

    def fused(self, x: torch.Tensor) -> bool:
        return (bool(self.gdn_fused) and x.dtype == torch.bfloat16 and self.weight.dtype == x.dtype
                and norm_ops.on_kernel_device(x) and x.shape[-1] == self.weight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused(x):
            return norm_ops.zc_rms_norm(x, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)

    def add(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, this norm of it): one launch where fused."""
        if self.fused(x) and delta.shape == x.shape and delta.dtype == x.dtype:
            return norm_ops.add_zc_rms_norm(x, delta, self.weight, self.eps)
        total = x + delta
        return total, self(total)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]: rotate-half rotary on the first cos.shape[-1] dims of each head; the rest pass through."""
    r = cos.shape[-1]
    return torch.cat((apply_rope(x[..., :r], cos, sin), x[..., r:]), dim=-1)


class GatedAttention(nn.Module):
    """Softmax attention with a sigmoid output gate. q_proj's rows hold, per head, the query then its gate
    ([H, 2D] viewed); the checkpoint's q_proj, k_proj and v_proj are stacked into qkv_proj at load.

    layer: this layer's index among the full-attention layers, i.e. into the paged KV pool's layer axis. Under the
    gated_rope knob bf16 rows on a kernel device take q_norm, k_norm and the partial rotary of both in one launch
    (norm_ops.zc_norm_partial_rope), in place of torch's rotate-half, slices and concatenations (chosen by
    select_backends for bf16 nodes on sm_90).
    """

    gated_rope: int = 0       # a kernel knob (graphc/modules.py KERNEL_KNOBS)

    def __init__(self, cfg: Qwen3_5TextConfig, layer: int):
        super().__init__()
        self.layer, self.h, self.kv, self.d = layer, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, (2 * self.h + 2 * self.kv) * self.d, bias=False)
        self.o_proj = Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.q_norm = ZeroCentredRMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = ZeroCentredRMSNorm(self.d, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv) -> torch.Tensor:
        t, h, d = x.shape[0], self.h, self.d
        qkv = self.qkv_proj(x)
        q_gate = qkv[:, :2 * h * d].view(t, h, 2 * d)
        q, gate = q_gate[..., :d], q_gate[..., d:]                                     # [T, H, D] each
        k = qkv[:, 2 * h * d:(2 * h + self.kv) * d].view(t, self.kv, d)
        v = qkv[:, (2 * h + self.kv) * d:].view(t, self.kv, d)
        if self.gated_rope and q.dtype == torch.bfloat16 == self.q_norm.weight.dtype and norm_ops.on_kernel_device(q):
            q, k = norm_ops.zc_norm_partial_rope(q, k, self.q_norm.weight, self.k_norm.weight, cos, sin,
                                                 self.q_norm.eps)
        else:
            q = apply_partial_rope(self.q_norm(q), cos, sin)
            k = apply_partial_rope(self.k_norm(k), cos, sin)
        o = kv(self.layer, q, k, v) * torch.sigmoid(gate)                              # [T, H, D]
        return self.o_proj(o.reshape(t, h * d))


def feed_forward(cfg: Qwen3_5TextConfig) -> nn.Module:
    """A layer's MLP: dense SwiGLU, or (a MoE config) the router, routed experts and gated shared expert."""
    if not cfg.is_moe:
        return SwiGLU(cfg.hidden_size, cfg.intermediate_size)
    return SparseMoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                     cfg.norm_topk_prob, cfg.shared_expert_intermediate_size)


class Qwen3_5DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3_5TextConfig, layer: int):
        super().__init__()
        self.tp = cfg.tp
        self.is_linear = cfg.layer_types[layer] == "linear_attention"
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(cfg.gdn, cfg.kind_index(layer))
        else:
            self.self_attn = GatedAttention(cfg, cfg.kind_index(layer))
        self.input_layernorm = ZeroCentredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = ZeroCentredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = feed_forward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: StepContext,
                delta: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: the residual stream; delta: what the layer before added to it, not yet summed (None: nothing).
        Returns the same pair, so that each residual add runs with the norm after it (one launch where fused)."""
        x, h = (x, self.input_layernorm(x)) if delta is None else self.input_layernorm.add(x, delta)
        mixed = self.linear_attn(h, ctx["state"]) if self.is_linear else self.self_attn(h, cos, sin, ctx["kv"])
        x, h = self.post_attention_layernorm.add(x, ctx.reduce(mixed))
        if self.tp > 1:
            return x, ctx.reduce(self.mlp(h))       # the ranks' partial sums first, the residual once
        if isinstance(self.mlp, SparseMoE):
            return self.mlp(h, residual=x), None    # the residual add in the block's last sum (HF's order of adds)
        return x, self.mlp(h)


class Qwen3_5TextBody(nn.Module):
    def __init__(self, cfg: Qwen3_5TextConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen3_5DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = ZeroCentredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen3_5LM(NodeModule):
    """Node: token ids (+ optional spliced encoder rows) -> logits of the rows to sample.

    Inputs: token_ids [T], positions [3, T] int64 (M-RoPE T, H, W rows; all equal for text), sample_rows [S];
    optional group 'mm': mm_embeds [M, D] (an encoder's output rows) and mm_rows [T] (index into mm_embeds,
    -1 for text rows). Output: logits [S, V] in fp32. ctx["kv"]: the full layers' paged KV (called
    kv(layer, q, k, v)); ctx["state"]: the linear layers' StateStep (resources/linear_state.py), whose
    sequences are this step's, in the same order and lengths as the rows.
    """

    ROLES = {"kv": "paged_kv", "state": "linear_state"}

    def __init__(self, cfg: Qwen3_5TextConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.language_model = Qwen3_5TextBody(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.body.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg.rotary_dim, cfg.rope_theta), persistent=False)
        self.register_buffer("mrope_slots", mrope_slots(cfg.rotary_dim, cfg.mrope_section), persistent=False)

    def tp_splits(self) -> list[Split]:
        """A rank's part of each split disk tensor (names under model.language_model.layers.N.): by head, rows of
        the column-parallel projections and per-head vectors, columns of the row-parallel ones; block lengths
        are the whole config's."""
        whole, gdn = self.cfg.whole(), self.cfg.whole().gdn
        at = r"model\.language_model\.layers\.\d+\."
        q, kv = 2 * whole.num_attention_heads * whole.head_dim, whole.num_key_value_heads * whole.head_dim
        out = [Split(at + r"self_attn\.(q_proj|k_proj|v_proj)\.weight", 0),
               Split(at + r"self_attn\.qkv_proj\.weight", 0, (q, kv, kv)),
               Split(at + r"self_attn\.o_proj\.weight", 1),
               Split(at + r"linear_attn\.(in_proj_qkv|conv1d)\.weight", 0, (gdn.key_dim, gdn.key_dim, gdn.value_dim)),
               Split(at + r"linear_attn\.(in_proj_z\.weight|in_proj_b\.weight|in_proj_a\.weight|A_log|dt_bias)", 0),
               Split(at + r"linear_attn\.out_proj\.weight", 1)]
        mlps = r"mlp\.(experts\.\d+\.|shared_expert\.)" if whole.is_moe else r"mlp\."
        out += [Split(at + mlps + r"(gate_proj|up_proj)\.weight", 0), Split(at + mlps + r"down_proj\.weight", 1)]
        if whole.is_moe:
            i, shared = whole.moe_intermediate_size, whole.shared_expert_intermediate_size
            out += [Split(at + r"mlp\.experts\.gate_up_proj", 1, (i, i)), Split(at + r"mlp\.experts\.down_proj", 2),
                    Split(at + r"mlp\.shared_expert\.gate_up_proj\.weight", 0, (shared, shared))]
        else:
            out.append(Split(at + r"mlp\.gate_up_proj\.weight", 0, (whole.intermediate_size,) * 2))
        return out

    @property
    def body(self) -> Qwen3_5TextBody:
        return self.model.language_model

    def embed(self, token_ids: torch.Tensor, mm_embeds: torch.Tensor | None, mm_rows: torch.Tensor | None
              ) -> torch.Tensor:
        x = self.body.embed_tokens(token_ids)                         # [T, D]
        return x if mm_embeds is None else splice(x, mm_embeds, mm_rows)

    def forward(self, ctx: StepContext, token_ids: torch.Tensor, positions: torch.Tensor,
                sample_rows: torch.Tensor, mm_embeds: torch.Tensor | None = None,
                mm_rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        x = self.embed(token_ids, mm_embeds, mm_rows)
        cos, sin = mrope_cos_sin(positions, self.inv_freq, self.mrope_slots, x.dtype)   # [T, 1, rotary_dim]
        delta = None
        for layer in self.body.layers:
            x, delta = layer(x, cos, sin, ctx, delta)
        x = x.index_select(0, sample_rows)
        if delta is not None:                                          # the last add, on the sampled rows only
            x = x + delta.index_select(0, sample_rows)
        x = self.body.norm(x)                                          # [S, D]
        return {"logits": self.lm_head(x).float()}
