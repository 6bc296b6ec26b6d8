"""Qwen3-Omni's vision tower (thinker.visual) as a serving node over packed patches.

A step carries P patches of several images / video slices, packed in HF's 2x2 merge-block order
(models/components/vision_inputs.py builds them). Everything that depends on the image grids
(pos-embed interpolation taps, rotary positions, attention segments) arrives as tensors or is bound
into the attention resource, so the forward has static shapes for a given P and can be captured.

Weight names are the checkpoint's minus 'thinker.visual.': patch_embed.proj (Conv3d-shaped),
pos_embed, blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.linear_fc1, mlp.linear_fc2},
merger.{ln_q, mlp.0, mlp.2}, merger_list.K.{ln_q, mlp.0, mlp.2}.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graphc import NodeModule, StepContext
from models.components.layers import LayerNorm, apply_rope, rope_inv_freq
from models.components.vision_config import TAPS, VisionConfig, vision_node  # noqa: F401


class PatchEmbed(nn.Module):
    """Conv3d with kernel == stride over one patch each: a single GEMM over flattened patches.

    The parameter keeps the checkpoint's Conv3d shape [hidden, C, T, p, p]; its row-major flattening
    is the patch layout the processor emits (C, T, p, p)."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel_size=kernel, stride=kernel, bias=True)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        w = self.proj.weight
        return F.linear(patches.to(w.dtype), w.view(w.shape[0], -1), self.proj.bias)   # [P, D]


class VisionAttention(nn.Module):
    # a kernel choice (graphc.modules.KERNEL_KNOBS, set at boot and in the simulation): 1 rotates q and k in one
    # fp32 launch (norm_ops.q_k_rope_f32) on a GPU and on meta tensors, where the torch path runs about a dozen
    # kernels over fp32 copies; where the attention backend runs the head dim zero-padded (its run_head_dim), the
    # same launch writes q, k and v padded, so that the backend makes no padded copies of its own
    fused_rope: int = 0

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.h, self.d = cfg.num_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=True)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv(x).view(t, 3, self.h, self.d).unbind(1)   # each [P, H, D]
        # HF rotates in fp32 and casts back: bf16 rotary would drift from the reference.
        if self.fused_rope and x.device.type in ("cuda", "meta") and cos.dtype == sin.dtype == torch.float32:
            from models.components.norm_ops import q_k_rope_f32
            width = attn.run_head_dim                 # every ragged backend says the width it runs
            if width == self.d:
                q, k = q_k_rope_f32(q, k, cos, sin)
            else:
                q, k, v = q_k_rope_f32(q, k, cos, sin, v=v, width=width)
        else:
            q = apply_rope(q.float(), cos, sin).to(x.dtype)
            k = apply_rope(k.float(), cos, sin).to(x.dtype)
        return self.proj(attn(q, k, v).reshape(t, self.h * self.d))


class VisionMLP(nn.Module):
    # a kernel choice (graphc.modules.KERNEL_KNOBS): 1 runs linear_fc1's bias and tanh GELU in cuBLASLt's GEMM
    # epilogue on a GPU (torch._addmm_activation; on meta tensors too, where the compiler traces it): one launch
    # and one rounding in place of the GEMM's bf16 output, then a GELU kernel reading and writing it again
    fused_gelu: int = 0

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_gelu and x.device.type in ("cuda", "meta") and x.dim() == 2:
            # (only CUDA's _addmm_activation is the tanh GELU; the CPU's is the exact one)
            h = torch._addmm_activation(self.linear_fc1.bias, x, self.linear_fc1.weight.t(), use_gelu=True)
        else:
            h = F.gelu(self.linear_fc1(x), approximate="tanh")                # gelu_pytorch_tanh
        return self.linear_fc2(h)


class VisionBlock(nn.Module):
    """HF's block: x + attn(norm1(x)), then + mlp(norm2(.)). Here as a residual stream: it takes x and the
    previous block's output delta not yet added (None for the first block), and returns its own x and delta,
    so that each residual add runs with the norm after it (LayerNorm.add: one launch where fused)."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.norm1 = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attn = VisionAttention(cfg)
        self.norm2 = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                attn) -> tuple[torch.Tensor, torch.Tensor]:
        if delta is None:
            h = self.norm1(x)
        else:
            x, h = self.norm1.add(x, delta)
        x, h = self.norm2.add(x, self.attn(h, cos, sin, attn))
        return x, self.mlp(h)


class PatchMerger(nn.Module):
    """m x m neighbouring patches -> one LLM token. The final merger normalises each patch before
    grouping (ln_q over hidden); the deepstack mergers group first (ln_q over m*m*hidden)."""

    def __init__(self, cfg: VisionConfig, postshuffle_norm: bool):
        super().__init__()
        self.grouped = cfg.hidden_size * cfg.merge_unit
        self.postshuffle_norm = postshuffle_norm
        self.ln_q = nn.LayerNorm(self.grouped if postshuffle_norm else cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = nn.Sequential(nn.Linear(self.grouped, self.grouped), nn.GELU(),
                                 nn.Linear(self.grouped, cfg.out_hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.postshuffle_norm:
            x = self.ln_q(x.view(-1, self.grouped))           # [P/4, 4D]
        else:
            x = self.ln_q(x).view(-1, self.grouped)
        return self.mlp(x)                                    # [P/4, out]


class VisionEncoder(NodeModule):
    """Node: packed patches of images / video slices -> merged tokens and deepstack features.

    Inputs (P patches; host-built, see vision_inputs.build_step):
      pixel_patches [P, C*T*p*p]  normalised pixels, one row per patch, in merge-block order
      pos_index     [P, 4] int64  rows of pos_embed each patch interpolates (bilinear taps)
      pos_weight    [P, 4] fp32   their weights
      rope_pos      [P, 2] int64  (row, col) of each patch in its frame, for the 2-D rotary
    Attention segments (one per image / per temporal slice of a video) are bound into role 'attn'.
    Outputs: embeds [ceil(P/4), out_hidden_size]; deepstack [len(deepstack_visual_indexes),
    ceil(P/4), out_hidden_size], level k taken after block deepstack_visual_indexes[k] (the thinker
    adds level k after its decoder layer k). Merged row r comes from patches 4r..4r+3.
    """

    ROLES = {"attn": "ragged_attention"}

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, postshuffle_norm=False)
        self.merger_list = nn.ModuleList(PatchMerger(cfg, postshuffle_norm=True)
                                         for _ in cfg.deepstack_visual_indexes)
        # Each spatial axis rotates a quarter of the head's dims: head_dim/4 frequencies over head_dim/2.
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim // 2, cfg.rope_theta), persistent=False)

    def rotary(self, rope_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """rope_pos [P, 2] -> cos, sin [P, 1, head_dim] fp32: (row freqs | col freqs) twice."""
        freqs = (rope_pos.float()[:, :, None] * self.inv_freq.float()).flatten(1)   # [P, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]                           # [P, 1, D]
        return emb.cos(), emb.sin()

    def embed(self, pixel_patches: torch.Tensor, pos_index: torch.Tensor, pos_weight: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixel_patches)                                   # [P, D]
        # The taps are summed with fp32 weights, as HF does, and only then cast to the activations.
        pos = (self.pos_embed(pos_index) * pos_weight[:, :, None]).sum(1)     # [P, D]
        return x + pos.to(x.dtype)

    def grouped(self, x: torch.Tensor) -> torch.Tensor:
        """Pad the rows to whole merge groups: a step's P need not be a multiple of 4."""
        short = -x.shape[0] % self.cfg.merge_unit
        return F.pad(x, (0, 0, 0, short)) if short else x

    def forward(self, ctx: StepContext, pixel_patches: torch.Tensor, pos_index: torch.Tensor,
                pos_weight: torch.Tensor, rope_pos: torch.Tensor) -> dict[str, torch.Tensor]:
        attn = ctx["attn"]
        x = self.embed(pixel_patches, pos_index, pos_weight)
        cos, sin = self.rotary(rope_pos)
        levels = self.cfg.deepstack_visual_indexes
        rows = -(-x.shape[0] // self.cfg.merge_unit)
        deepstack = x.new_empty(len(levels), rows, self.cfg.out_hidden_size)   # filled level by level
        delta = None
        for i, block in enumerate(self.blocks):
            x, delta = block(x, delta, cos, sin, attn)
            if i in levels:                                   # the block's whole output: its delta added
                x, delta = x + delta, None
                k = levels.index(i)
                deepstack[k] = self.merger_list[k](self.grouped(x))
        if delta is not None:
            x = x + delta
        return {"embeds": self.merger(self.grouped(x)), "deepstack": deepstack}
