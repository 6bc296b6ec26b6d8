"""The thinker's declaration half: its config (HF names), the real model's, and the node's ports. No torch:
a model file declares from here, and a plan made from the disk cache imports neither torch nor the module
(models/components/thinker.py)."""
from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from graphc import Port
from graphc import Strict


def check_mrope_section(head_dim: int, mrope_section: Sequence[int]) -> None:
    """M-RoPE's three sections (T, H, W frequency slots) must fill head_dim/2."""
    if len(mrope_section) != 3 or sum(mrope_section) != head_dim // 2:
        raise ValueError(f"mrope_section {list(mrope_section)} must be three sections summing to head_dim/2 = "
                         f"{head_dim // 2}")


class MoETextConfig(Strict):
    """The fields Qwen3-Omni's thinker and talker text models share (HF names)."""

    vocab_size: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    head_dim: int = Field(ge=2)
    moe_intermediate_size: int = Field(ge=1)
    num_experts: int = Field(ge=1)
    num_experts_per_tok: int = Field(ge=1)
    norm_topk_prob: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    mrope_section: tuple[int, int, int] = (24, 20, 20)

    @model_validator(mode="after")
    def _check_text(self) -> "MoETextConfig":
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} > num_experts {self.num_experts}")
        check_mrope_section(self.head_dim, self.mrope_section)
        return self


class ThinkerConfig(MoETextConfig):
    """accept_hidden_layer (the talker's, 24 for the real model): when set, the node also outputs 'embeds'
    (the spliced input embeddings) and 'hidden' (the output of that decoder layer, before any deepstack
    addition), which the talker's projections read. HF's hidden_states[k] for 1 <= k < num_hidden_layers."""

    accept_hidden_layer: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _check_accept(self) -> "ThinkerConfig":
        if self.accept_hidden_layer is not None and self.accept_hidden_layer >= self.num_hidden_layers:
            raise ValueError(f"accept_hidden_layer {self.accept_hidden_layer} must be < num_hidden_layers "
                             f"{self.num_hidden_layers} (HF's last hidden state is the normed one)")
        return self


# Qwen/Qwen3-Omni-30B-A3B-Instruct's thinker text model (the fact sheet's section 1c)
THINKER_30B_A3B = ThinkerConfig(vocab_size=152064, hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                                num_key_value_heads=4, head_dim=128, moe_intermediate_size=768, num_experts=128,
                                num_experts_per_tok=8, norm_topk_prob=True, accept_hidden_layer=24)


def thinker_ports(cfg: ThinkerConfig, audio_rows: str, visual_rows: str, deepstack: int,
                  dtype: str = "bfloat16") -> tuple[dict, dict]:
    """The node's (inputs, outputs): token rows of a step, sample rows, and the optional 'audio' and
    'visual' groups that splice an encoder's output rows (audio_rows / visual_rows: those encoders'
    row axes, e.g. 'windows*104' and 'patches/4')."""
    h = cfg.hidden_size
    inputs = {"token_ids": Port(shape=("tokens",), dtype="int64"),
              "positions": Port(shape=(3, "tokens"), dtype="int64"),
              "sample_rows": Port(shape=("seqs",), dtype="int64"),
              "audio_embeds": Port(shape=(audio_rows, h), dtype=dtype, optional="audio"),
              "audio_rows": Port(shape=("tokens",), dtype="int64", optional="audio"),
              "visual_embeds": Port(shape=(visual_rows, h), dtype=dtype, optional="visual"),
              "visual_rows": Port(shape=("tokens",), dtype="int64", optional="visual"),
              "deepstack": Port(shape=(deepstack, visual_rows, h), dtype=dtype, optional="visual")}
    outputs = {"logits": Port(shape=("seqs", cfg.vocab_size), dtype="float32")}
    if cfg.accept_hidden_layer is not None:
        outputs |= {"embeds": Port(shape=("tokens", h), dtype=dtype), "hidden": Port(shape=("tokens", h), dtype=dtype)}
    return inputs, outputs
