"""Qwen3-Omni's vision tower (thinker.visual) as a serving node over packed patches; the same tower serves
Qwen3-VL and Qwen3.5 (model.visual, Qwen3.5 without deepstack) under their weight names.

A step carries P patches of several images / video slices, packed in HF's 2x2 merge-block order
(models/components/vision_inputs.py builds them). Everything that depends on the image grids
(pos-embed interpolation taps, rotary positions, attention segments) arrives as tensors or is bound
into the attention resource, so the forward has static shapes for a given P and can be captured.

Weight names are the checkpoint's minus its prefix: patch_embed.proj (Conv3d-shaped), pos_embed,
blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.linear_fc1, mlp.linear_fc2}, then the mergers, named by layout:
  VisionEncoder (Qwen3-Omni, 'thinker.visual.'): merger.{ln_q, mlp.0, mlp.2}, merger_list.K.{ln_q, mlp.0, mlp.2}
  Qwen3VLVisionEncoder (Qwen3-VL, Qwen3.5, 'model.visual.'): merger.{norm, linear_fc1, linear_fc2},
    deepstack_merger_list.K.{norm, linear_fc1, linear_fc2}
The arithmetic is one (HF's Qwen3OmniMoeVisionEncoder, Qwen3VLVisionModel and Qwen3_5VisionModel agree).
"""
from __future__ import annotations

from typing import ClassVar

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
    grouping (norm over hidden); the deepstack mergers group first (norm over m*m*hidden). The norm,
    then Linear, erf GELU, Linear: under Qwen3-Omni's names (ln_q, mlp.0, mlp.2) or, with
    qwen3_vl_names, Qwen3-VL's (norm, linear_fc1, linear_fc2)."""

    def __init__(self, cfg: VisionConfig, postshuffle_norm: bool, qwen3_vl_names: bool = False):
        super().__init__()
        self.grouped = cfg.hidden_size * cfg.merge_unit
        self.postshuffle_norm = postshuffle_norm
        self.qwen3_vl_names = qwen3_vl_names
        norm = nn.LayerNorm(self.grouped if postshuffle_norm else cfg.hidden_size, eps=cfg.layer_norm_eps)
        fc1, fc2 = nn.Linear(self.grouped, self.grouped), nn.Linear(self.grouped, cfg.out_hidden_size)
        if qwen3_vl_names:
            self.norm, self.linear_fc1, self.linear_fc2 = norm, fc1, fc2
        else:
            self.ln_q, self.mlp = norm, nn.Sequential(fc1, nn.GELU(), fc2)

    def parts(self) -> tuple[nn.LayerNorm, nn.Linear, nn.Linear]:
        """The norm and the two projections, whatever their names."""
        if self.qwen3_vl_names:
            return self.norm, self.linear_fc1, self.linear_fc2
        return self.ln_q, self.mlp[0], self.mlp[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm, fc1, fc2 = self.parts()
        if self.postshuffle_norm:
            x = norm(x.view(-1, self.grouped))                # [P/4, 4D]
        else:
            x = norm(x).view(-1, self.grouped)
        return fc2(F.gelu(fc1(x)))                            # [P/4, out]


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
    adds level k after its decoder layer k), and only where the config has levels (vision_node declares
    it so). Merged row r comes from patches 4r..4r+3. Weights under Qwen3-Omni's names.
    """

    ROLES = {"attn": "ragged_attention"}
    QWEN3_VL_NAMES: ClassVar[bool] = False

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        vl = self.QWEN3_VL_NAMES
        self.merger = PatchMerger(cfg, postshuffle_norm=False, qwen3_vl_names=vl)
        mergers = nn.ModuleList(PatchMerger(cfg, postshuffle_norm=True, qwen3_vl_names=vl)
                                for _ in cfg.deepstack_visual_indexes)
        if vl:
            self.deepstack_merger_list = mergers
        else:
            self.merger_list = mergers
        # Each spatial axis rotates a quarter of the head's dims: head_dim/4 frequencies over head_dim/2.
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim // 2, cfg.rope_theta), persistent=False)

    def deepstack_mergers(self) -> nn.ModuleList:
        return self.deepstack_merger_list if self.QWEN3_VL_NAMES else self.merger_list

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
        levels, mergers = self.cfg.deepstack_visual_indexes, self.deepstack_mergers()
        rows = -(-x.shape[0] // self.cfg.merge_unit)
        deepstack = x.new_empty(len(levels), rows, self.cfg.out_hidden_size) if levels else None   # level by level
        delta = None
        for i, block in enumerate(self.blocks):
            x, delta = block(x, delta, cos, sin, attn)
            if i in levels:                                   # the block's whole output: its delta added
                x, delta = x + delta, None
                k = levels.index(i)
                deepstack[k] = mergers[k](self.grouped(x))
        if delta is not None:
            x = x + delta
        out = {"embeds": self.merger(self.grouped(x))}
        if deepstack is not None:                             # no port for zero levels (vision_node)
            out["deepstack"] = deepstack
        return out


class Qwen3VLVisionEncoder(VisionEncoder):
    """The same node under Qwen3-VL's weight names, which Qwen3.5 keeps (checkpoint prefix 'model.visual.'):
    merger.{norm, linear_fc1, linear_fc2}, deepstack_merger_list.K.{...}. Qwen3.5's configs have no deepstack
    levels: no deepstack mergers, no 'deepstack' output. Declared by vision_node(cfg, layout="qwen3_vl")."""

    QWEN3_VL_NAMES = True
