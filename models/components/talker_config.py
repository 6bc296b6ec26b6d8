"""The talker's declaration half: its config and its code predictor's (HF names), the real model's, the
`sampling` port's columns and the node's ports. No torch (see thinker_config.py); the module is
models/components/talker.py."""
from __future__ import annotations

from pydantic import Field, model_validator

from graphc import Port
from graphc import Strict
from models.components.thinker_config import MoETextConfig


class TalkerTextConfig(MoETextConfig):
    """HF's talker text_config; intermediate_size is the width of the two thinker->talker ResizeMLPs."""

    intermediate_size: int = Field(ge=1)
    shared_expert_intermediate_size: int = Field(ge=1)


class CodePredictorConfig(Strict):
    vocab_size: int = Field(ge=1)          # codebook size of codes 1..G-1
    hidden_size: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    head_dim: int = Field(ge=2)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0


class TalkerConfig(Strict):
    text_config: TalkerTextConfig
    code_predictor_config: CodePredictorConfig
    thinker_hidden_size: int = Field(ge=1)
    num_code_groups: int = Field(16, ge=2)
    codec_eos_token_id: int = Field(2150, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "TalkerConfig":
        text, cp = self.text_config, self.code_predictor_config
        if cp.hidden_size != text.hidden_size:
            raise ValueError(f"code predictor hidden_size {cp.hidden_size} != talker hidden_size {text.hidden_size}")
        if cp.num_attention_heads % cp.num_key_value_heads:
            raise ValueError("code predictor num_attention_heads must be a multiple of num_key_value_heads")
        if not cp.vocab_size <= text.vocab_size or self.codec_eos_token_id >= text.vocab_size:
            raise ValueError(f"need codebook {cp.vocab_size} <= codec vocab {text.vocab_size} and "
                             f"codec_eos_token_id {self.codec_eos_token_id} inside the codec vocab")
        return self


# Qwen/Qwen3-Omni-30B-A3B-Instruct's talker and code predictor (the fact sheet's sections 1d and 1e)
TALKER_30B_A3B = TalkerConfig(
    text_config=TalkerTextConfig(vocab_size=3072, hidden_size=1024, num_hidden_layers=20, num_attention_heads=16,
                                 num_key_value_heads=2, head_dim=128, moe_intermediate_size=384, num_experts=128,
                                 num_experts_per_tok=6, norm_topk_prob=True, intermediate_size=2048,
                                 shared_expert_intermediate_size=768),
    code_predictor_config=CodePredictorConfig(vocab_size=2048, hidden_size=1024, intermediate_size=3072,
                                              num_hidden_layers=5, num_attention_heads=16, num_key_value_heads=8,
                                              head_dim=128),
    thinker_hidden_size=2048, num_code_groups=16, codec_eos_token_id=2150)


def code_predictor_cu_seqlens(num_seqs: int, num_code_groups: int) -> list[int]:
    """The cp_attn binding's cu_seqlens (= cu_seqlens_k) for a step with num_seqs sampled rows."""
    return [i * num_code_groups for i in range(num_seqs + 1)]


# the `sampling` port's columns: code 0's temperature (0: greedy), top_k (0: off), 1 - top_p (0: off; taken
# in double on the host, as HF takes it before comparing with fp32 probabilities, so the fp32 threshold is
# HF's), repetition_penalty (over `seen`; 0 reads as 1), then the residual codes' temperature, top_k, 1 - top_p
SAMPLING = ("temperature", "top_k", "top_p_floor", "repetition_penalty",
            "residual_temperature", "residual_top_k", "residual_top_p_floor")


def sampling_row(temperature: float, top_k: int, top_p: float, repetition_penalty: float,
                 residual_temperature: float, residual_top_k: int, residual_top_p: float) -> list[float]:
    """One request's `sampling` row (SAMPLING's columns). temperature 0 makes the residual codes greedy too
    (HF mirrors the talker's do_sample onto the code predictor)."""
    greedy = temperature == 0
    return [temperature, top_k, 1 - top_p, repetition_penalty,
            0.0 if greedy else residual_temperature, residual_top_k, 1 - residual_top_p]


def talker_ports(cfg: TalkerConfig, dtype: str = "bfloat16") -> tuple[dict, dict]:
    """The node's (inputs, outputs): a step's rows and sample rows, each sample row's sampling parameters,
    random draws and seen code-0 ids; the optional 'prompt' group builds prompt rows from the thinker's
    embeddings and hidden states."""
    h, th, v = cfg.text_config.hidden_size, cfg.thinker_hidden_size, cfg.text_config.vocab_size
    inputs = {"embeds": Port(shape=("tokens", h), dtype=dtype),
              "positions": Port(shape=(3, "tokens"), dtype="int64"),
              "sample_rows": Port(shape=("seqs",), dtype="int64"),
              "trailing_text": Port(shape=("seqs", th), dtype=dtype),
              "sampling": Port(shape=("seqs", len(SAMPLING)), dtype="float32"),
              "noise": Port(shape=("seqs", cfg.num_code_groups, v), dtype="float32"),
              "seen": Port(shape=("seqs", v), dtype="bool"),
              "codec_ids": Port(shape=("tokens",), dtype="int64", optional="prompt"),
              "thinker_embeds": Port(shape=("tokens", th), dtype=dtype, optional="prompt"),
              "thinker_hidden": Port(shape=("tokens", th), dtype=dtype, optional="prompt"),
              "prompt_kind": Port(shape=("tokens",), dtype="int64", optional="prompt")}
    outputs = {"logits": Port(shape=("seqs", v), dtype="float32"),
               "codes": Port(shape=("seqs", cfg.num_code_groups), dtype="int64"),
               "next_embeds": Port(shape=("seqs", h), dtype=dtype)}
    return inputs, outputs
