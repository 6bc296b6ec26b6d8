"""The Gated DeltaNet layer's declaration half (models/components/gated_deltanet.py): its config, with the
field names of HF's Qwen3_5TextConfig, and the state resource its layers share. No torch."""
from __future__ import annotations

from pydantic import Field, model_validator

from graphc import Strict
from resources.linear_state import LinearStateSpec


class GatedDeltaNetConfig(Strict):
    """Qwen3.5-9B: hidden 4096, 16 key and 32 value heads of 128, kernel 4; 0.8B: hidden 1024, 16 and 16."""

    hidden_size: int = Field(ge=1)
    linear_num_key_heads: int = Field(ge=1)
    linear_num_value_heads: int = Field(ge=1)
    linear_key_head_dim: int = Field(ge=1)
    linear_value_head_dim: int = Field(ge=1)
    linear_conv_kernel_dim: int = Field(4, ge=2)
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"

    @model_validator(mode="after")
    def _check(self) -> "GatedDeltaNetConfig":
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(f"linear_num_value_heads {self.linear_num_value_heads} must be a multiple of "
                             f"linear_num_key_heads {self.linear_num_key_heads}: each key head serves a group")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act '{self.hidden_act}': the Gated DeltaNet layer runs 'silu' only "
                             "(every Qwen3.5 checkpoint's)")
        return self

    @classmethod
    def from_text_config(cls, text_config: dict) -> "GatedDeltaNetConfig":
        """The fields this layer reads from a checkpoint's text_config (which holds many more)."""
        return cls(**{name: text_config[name] for name in cls.model_fields if name in text_config})

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


def state_spec(cfg: GatedDeltaNetConfig, name: str, num_layers: int, conv_dtype: str = "bfloat16",
               state_dtype: str = "float32", slots: int | None = None) -> LinearStateSpec:
    """The state slots of `num_layers` such layers (each layer's index into them is its `layer` argument)."""
    return LinearStateSpec(name=name, num_layers=num_layers, num_key_heads=cfg.linear_num_key_heads,
                           num_value_heads=cfg.linear_num_value_heads, key_head_dim=cfg.linear_key_head_dim,
                           value_head_dim=cfg.linear_value_head_dim, conv_kernel=cfg.linear_conv_kernel_dim,
                           conv_dtype=conv_dtype, state_dtype=state_dtype, slots=slots)
