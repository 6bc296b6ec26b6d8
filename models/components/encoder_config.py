"""The window encoder's config (models/components/encoder.py), without torch (see thinker_config.py)."""
from __future__ import annotations

from pydantic import Field

from graphc import Strict


class EncoderConfig(Strict):
    input_dim: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    ffn_dim: int = Field(ge=1)
    output_dim: int = Field(ge=1)
    layer_norm_eps: float = 1e-5
