"""The vision tower's declaration half (models/components/vision.py): its config (HF names) and its node,
named by import path. No torch (see thinker_config.py)."""
from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

import graphc as gc
from graphc import Strict

TAPS = 4   # bilinear interpolation reads 2x2 rows of the learned position grid per patch


class VisionConfig(Strict):
    """Field names follow HF's Qwen3OmniMoeVisionEncoderConfig and Qwen3_5VisionConfig, which differ only in
    deepstack_visual_indexes (Qwen3.5 has none: its config.json says [], HF's class has no such field);
    rope_theta is their rope_parameters'. Both hard-code LayerNorm eps 1e-6."""

    depth: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    out_hidden_size: int = Field(ge=1)
    num_position_embeddings: int = Field(ge=1)
    deepstack_visual_indexes: tuple[int, ...] = ()     # blocks whose outputs feed the LLM's early layers
    in_channels: int = Field(3, ge=1)
    patch_size: int = Field(16, ge=1)
    temporal_patch_size: int = Field(2, ge=1)
    spatial_merge_size: int = Field(2, ge=1)
    hidden_act: Literal["gelu_pytorch_tanh"] = "gelu_pytorch_tanh"   # the blocks' MLP; the mergers use erf GELU
    rope_theta: float = 10_000.0
    layer_norm_eps: float = 1e-6

    @model_validator(mode="after")
    def _shapes(self) -> "VisionConfig":
        if self.hidden_size % self.num_heads or self.head_dim % 4:
            raise ValueError(f"hidden_size {self.hidden_size} / num_heads {self.num_heads} must be a multiple of 4 "
                             "(2-D rotary: a quarter of each head's dims per axis, sin and cos)")
        if math.isqrt(self.num_position_embeddings) ** 2 != self.num_position_embeddings:
            raise ValueError(f"num_position_embeddings {self.num_position_embeddings} must be a square grid")
        idx = list(self.deepstack_visual_indexes)
        if idx and (idx != sorted(set(idx)) or idx[0] < 0 or idx[-1] >= self.depth):
            raise ValueError(f"deepstack_visual_indexes {idx} must increase strictly within 0..{self.depth - 1}")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    @property
    def grid_side(self) -> int:
        return math.isqrt(self.num_position_embeddings)

    @classmethod
    def from_hf(cls, vision_config: dict) -> "VisionConfig":
        """From a checkpoint's vision_config (Qwen3-Omni: thinker_config.vision_config; Qwen3-VL and
        Qwen3.5: vision_config) or HF's config.to_dict(); keys that do not change the tower's math
        (model_type, initializer_range, image_size, ...) are dropped."""
        keys = set(cls.model_fields) - {"rope_theta", "layer_norm_eps"}
        fields = {k: v for k, v in vision_config.items() if k in keys}
        rope = vision_config.get("rope_parameters") or {}
        if rope.get("rope_type", "axial") not in ("axial", "default"):
            raise ValueError(f"vision rope_type {rope['rope_type']!r}: the tower runs HF's axial 2-D rotary")
        if "rope_theta" in rope:
            fields["rope_theta"] = rope["rope_theta"]
        return cls(**fields)


# The checkpoint layouts the tower loads, by the names of their weights (models/components/vision.py says
# which): its module class, and where the tower sits in a checkpoint.
LAYOUTS = {"qwen3_omni": ("models.components.vision:VisionEncoder", "thinker.visual."),
           "qwen3_vl": ("models.components.vision:Qwen3VLVisionEncoder", "model.visual.")}

# Qwen3.5's towers (reference sheet qwen3_5.md §2.1 and §4): Qwen3-VL's ViT without DeepStack.
VISION_QWEN3_5_9B = VisionConfig(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304,
                                 out_hidden_size=4096, num_position_embeddings=2304)
VISION_QWEN3_5_0_8B = VisionConfig(depth=12, hidden_size=768, num_heads=12, intermediate_size=3072,
                                   out_hidden_size=1024, num_position_embeddings=2304)


def vision_node(cfg: VisionConfig, *, name: str = "vision", attn: str = "vision_attn", dtype: str = "bfloat16",
                weight_prefix: str | None = None, layout: Literal["qwen3_omni", "qwen3_vl"] = "qwen3_omni") -> gc.Node:
    """The tower's declaration on the 'patches' axis; `attn` names a RaggedAttentionSpec with
    num_heads=cfg.num_heads, head_dim=cfg.head_dim and max_segment = the largest frame's h*w.
    `layout` picks the weight names (Qwen3-Omni's, or Qwen3-VL's, which Qwen3.5 keeps) and the default
    weight_prefix; a tower without deepstack levels (Qwen3.5) has no 'deepstack' output."""
    module, prefix = LAYOUTS[layout]
    merged = f"patches/{cfg.merge_unit}"
    outputs = {"embeds": gc.Port(shape=(merged, cfg.out_hidden_size), dtype=dtype)}
    if cfg.deepstack_visual_indexes:
        outputs["deepstack"] = gc.Port(shape=(len(cfg.deepstack_visual_indexes), merged, cfg.out_hidden_size),
                                       dtype=dtype)
    return gc.Node(
        name=name, module=module, config=cfg, dtype=dtype,
        weight_prefix=prefix if weight_prefix is None else weight_prefix,
        inputs={"pixel_patches": gc.Port(shape=("patches", cfg.patch_dim), dtype=dtype),
                "pos_index": gc.Port(shape=("patches", TAPS), dtype="int64"),
                "pos_weight": gc.Port(shape=("patches", TAPS), dtype="float32"),
                "rope_pos": gc.Port(shape=("patches", 2), dtype="int64")},
        outputs=outputs,
        resources={"attn": attn},
    )
