"""The dense Qwen3 LM's declaration half (models/components/qwen3_dense.py): its config and the node's ports.
No torch (see thinker_config.py)."""
from __future__ import annotations

from pydantic import Field

from graphc import Port
from graphc import Strict


class Qwen3Config(Strict):
    vocab_size: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=2)
    intermediate_size: int = Field(ge=1)
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False


def lm_ports(cfg: Qwen3Config, mm_rows: str, dtype: str = "bfloat16") -> tuple[dict[str, Port], dict[str, Port]]:
    """Qwen3LM's (inputs, outputs): tokens of a step, sample rows, and the optional 'mm' group that
    splices an encoder's output rows (mm_rows: that encoder's row axis, e.g. 'windows*104')."""
    inputs = {"token_ids": Port(shape=("tokens",), dtype="int64"),
              "positions": Port(shape=("tokens",), dtype="int64"),
              "sample_rows": Port(shape=("seqs",), dtype="int64"),
              "mm_embeds": Port(shape=(mm_rows, cfg.hidden_size), dtype=dtype, optional="mm"),
              "mm_rows": Port(shape=("tokens",), dtype="int64", optional="mm")}
    return inputs, {"logits": Port(shape=("seqs", cfg.vocab_size), dtype="float32")}
