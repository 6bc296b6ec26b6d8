"""AuT's declaration half (the audio encoder of Qwen3-Omni and Qwen3-ASR, models/components/aut.py): its
config (HF names), the real models', the node's ports and its attention resource. No torch (see
thinker_config.py)."""
from __future__ import annotations

from pydantic import Field, model_validator

from graphc import Port
from graphc import Strict
from models.components.encoder_config import EncoderConfig
from resources.ragged_attention import RaggedAttentionSpec


def conv_len(n: int) -> int:
    """Length after one Conv2d(kernel 3, stride 2, padding 1); 0 stays 0."""
    return (n - 1) // 2 + 1


def conv3_len(n: int) -> int:
    return conv_len(conv_len(conv_len(n)))


class AuTConfig(Strict):
    """Field names follow HF's Qwen3OmniMoeAudioEncoderConfig / Qwen3ASREncoderConfig."""

    num_mel_bins: int = Field(128, ge=1)
    d_model: int = Field(ge=2)
    encoder_layers: int = Field(ge=1)
    encoder_attention_heads: int = Field(ge=1)
    encoder_ffn_dim: int = Field(ge=1)
    output_dim: int = Field(ge=1)
    downsample_hidden_size: int = Field(480, ge=1)
    n_window: int = Field(50, ge=1)           # half a chunk, in mel frames
    n_window_infer: int = Field(800, ge=1)    # an attention window, in mel frames
    conv_chunksize: int = Field(500, ge=1)    # chunks per conv call: bounds the front end's peak memory
    layer_norm_eps: float = 1e-5

    @model_validator(mode="after")
    def _shapes(self) -> "AuTConfig":
        if self.d_model % self.encoder_attention_heads or self.d_model % 2:
            raise ValueError(f"d_model {self.d_model} must be even and a multiple of "
                             f"encoder_attention_heads {self.encoder_attention_heads}")
        if self.n_window_infer % self.chunk_frames:
            raise ValueError(f"n_window_infer {self.n_window_infer} must be a multiple of "
                             f"2*n_window {self.chunk_frames}")
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.encoder_attention_heads

    @property
    def chunk_frames(self) -> int:
        return 2 * self.n_window

    @property
    def chunk_tokens(self) -> int:
        return conv3_len(self.chunk_frames)

    @property
    def chunks_per_window(self) -> int:
        return self.n_window_infer // self.chunk_frames

    @property
    def window_tokens(self) -> int:
        return self.chunks_per_window * self.chunk_tokens

    @property
    def conv_freq_bins(self) -> int:
        return conv3_len(self.num_mel_bins)

    def layer_config(self) -> EncoderConfig:
        """The shared encoder layer's config (its input/output dims are unused by a layer)."""
        return EncoderConfig(input_dim=self.d_model, hidden_size=self.d_model, num_layers=self.encoder_layers,
                             num_heads=self.encoder_attention_heads, ffn_dim=self.encoder_ffn_dim,
                             output_dim=self.output_dim, layer_norm_eps=self.layer_norm_eps)


# Real sizes (fact sheet §1a and §6).
QWEN3_OMNI_AUT = AuTConfig(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
                           output_dim=2048)
QWEN3_ASR_0_6B_AUT = AuTConfig(d_model=896, encoder_layers=18, encoder_attention_heads=14, encoder_ffn_dim=3584,
                               output_dim=1024)
QWEN3_ASR_1_7B_AUT = AuTConfig(d_model=1024, encoder_layers=24, encoder_attention_heads=16, encoder_ffn_dim=4096,
                               output_dim=2048)


def node_ports(cfg: AuTConfig, dtype: str) -> tuple[dict[str, Port], dict[str, Port]]:
    """The node's (inputs, outputs) on the "windows" axis, in the layout above; dtype: the node's."""
    c, r = cfg.chunks_per_window, cfg.window_tokens
    inputs = {"mel": Port(shape=(f"windows*{c}", cfg.num_mel_bins, cfg.chunk_frames), dtype="float32"),
              "rows": Port(shape=(f"windows*{r}",), dtype="int64")}
    return inputs, {"embeds": Port(shape=(f"windows*{r}", cfg.output_dim), dtype=dtype)}


def attention_spec(cfg: AuTConfig, name: str, **kw) -> RaggedAttentionSpec:
    """The bidirectional window attention the node's "attn" role binds to."""
    return RaggedAttentionSpec(name=name, num_heads=cfg.encoder_attention_heads, head_dim=cfg.head_dim,
                               max_segment=cfg.window_tokens, rows_per_segment=cfg.window_tokens, **kw)
