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
    """Field names follow HF's Qwen3OmniMoeVisionEncoderConfig (rope_theta is its rope_parameters')."""

    depth: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    out_hidden_size: int = Field(ge=1)
    num_position_embeddings: int = Field(ge=1)
    deepstack_visual_indexes: tuple[int, ...] = Field(min_length=1)
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
        if idx != sorted(set(idx)) or idx[0] < 0 or idx[-1] >= self.depth:
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
        """From a checkpoint's thinker_config.vision_config (or HF's config.to_dict()); keys that do not
        change the tower's math (initializer_range, image_size, ...) are dropped."""
        keys = set(cls.model_fields) - {"rope_theta", "layer_norm_eps"}
        fields = {k: v for k, v in vision_config.items() if k in keys}
        rope = vision_config.get("rope_parameters") or {}
        if "rope_theta" in rope:
            fields["rope_theta"] = rope["rope_theta"]
        return cls(**fields)


def vision_node(cfg: VisionConfig, *, name: str = "vision", attn: str = "vision_attn",
                dtype: str = "bfloat16", weight_prefix: str = "thinker.visual.") -> gc.Node:
    """The tower's declaration on the 'patches' axis; `attn` names a RaggedAttentionSpec with
    num_heads=cfg.num_heads, head_dim=cfg.head_dim and max_segment = the largest frame's h*w."""
    merged = f"patches/{cfg.merge_unit}"
    return gc.Node(
        name=name, module="models.components.vision:VisionEncoder", config=cfg, dtype=dtype, weight_prefix=weight_prefix,
        inputs={"pixel_patches": gc.Port(shape=("patches", cfg.patch_dim), dtype=dtype),
                "pos_index": gc.Port(shape=("patches", TAPS), dtype="int64"),
                "pos_weight": gc.Port(shape=("patches", TAPS), dtype="float32"),
                "rope_pos": gc.Port(shape=("patches", 2), dtype="int64")},
        outputs={"embeds": gc.Port(shape=(merged, cfg.out_hidden_size), dtype=dtype),
                 "deepstack": gc.Port(shape=(len(cfg.deepstack_visual_indexes), merged, cfg.out_hidden_size),
                                      dtype=dtype)},
        resources={"attn": attn},
    )
