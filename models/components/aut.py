"""AuT, the audio encoder of Qwen3-Omni (thinker.audio_tower) and Qwen3-ASR, as a serving node.

Data flow: 100-frame mel chunks -> 3 x (Conv2d k3 s2 p1, GELU) over (freq, time) -> conv_out
(C*16 -> d_model, no bias) -> + per-chunk sinusoid (positions 0..12 in every chunk) -> packed
token rows -> pre-LN encoder layers, attention inside 104-token windows -> ln_post -> proj1, GELU,
proj2.

Step layout. The capture axis is "windows". With F = 2*n_window mel frames per chunk (100),
C = n_window_infer / F chunks per window (8), T = 13 tokens per full chunk (100 frames after three
stride-2 convolutions) and R = C*T tokens per window (104), a step of W windows is:

  mel    [W*C, num_mel_bins, F] float32 (cast to the weights' dtype inside)
         Chunk slots. An audio of L frames takes ceil(L/F) consecutive slots, frames [j*F, (j+1)*F)
         in its j-th slot, the last chunk zero-padded to F frames; audios follow each other in step
         order and unused slots are zero. Every chunk is padded to F frames whatever the other
         audios are (HF pads to the batch's longest chunk instead; the two agree whenever the batch
         holds a full chunk, and always for the Qwen3-ASR -hf encoder).
  rows   [W*R] int64
         The packed token layout, a permutation of the post-conv grid: grid row s*T + t is token
         t of chunk slot s, and packed row r is grid row rows[r]. Rows [0, N) are the step's N real
         tokens, audio by audio in time order (a chunk of r frames has ceil(ceil(ceil(r/2)/2)/2) real
         tokens, the first ones of its grid rows); rows [N, W*R) are the remaining (padding) grid rows.
  attn   the "attn" role's segments (cu_seqlens, bound with the resource): each audio's tokens cut
         into windows of R plus a remainder window, never crossing audios; cu_seqlens covers the real
         rows [0, N) only, so padding rows are in no segment, no real row attends to them, and their
         outputs are unspecified. At most W segments, as RaggedAttentionSpec.step_shape assumes.
  embeds [W*R, output_dim] in the node's dtype: packed row r's embedding; an audio's tokens are a
         contiguous run of rows starting at its offset (models/components/audio_inputs.pack_audios).

Windows are independent (convolutions stay inside a chunk, attention inside a window), so a long
audio may be cut at multiples of n_window_infer frames and its pieces packed in different steps.

Two checkpoint layouts, two node classes with the same forward:
  AuTEncoder    thinker.audio_tower.{conv2d1..3, conv_out, layers.N.*, ln_post, proj1, proj2}
                (Qwen3-Omni; original QwenLM Qwen3-ASR); weight_prefix "thinker.audio_tower.".
  AuTEncoderHF  model.audio_tower.{conv2d1..3, conv_out, layers.N.*, ln_post} and
                model.multi_modal_projector.{linear_1, linear_2} (Qwen3-ASR "-hf", as HF's
                Qwen3ASRForConditionalGeneration writes it); weight_prefix "model.". The prefix is
                shared with model.language_model.*, so load this node with strict=False and check
                unused tensors across all nodes of the checkpoint.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from graphc.declare import Port
from graphc.step import NodeModule, StepContext
from graphc.strict import Strict
from models.components.encoder import EncoderConfig, EncoderLayer
from resources import RaggedAttentionSpec


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


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """[length, channels] fp32: sin of every timescale, then cos (Whisper's table)."""
    step = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-step * torch.arange(channels // 2).float())
    scaled = torch.arange(length)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


# Mel chunks per front-end GEMM: bounds its im2col columns (32 x 800 x 4320 bf16 = 221 MB for the
# real model's second convolution).
CONV_GROUP = 32


def conv_s2(x: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """Conv2d(kernel 3, stride 2, padding 1) on [S, C, H, W] as im2col and one GEMM -> [S, H', W', out].

    Not cuDNN's convolution: in a captured graph that takes a workspace of its own choosing from
    the capture pool (912 MiB for Qwen3-Omni's audio steps on the H200), which no trace on the CPU
    can predict. Here every allocation is a tensor the compiler's simulation sees."""
    x = F.pad(x, (1, 1, 1, 1))
    cols = x.unfold(2, 3, 2).unfold(3, 3, 2)                       # [S, C, H', W', 3, 3], a view
    s, c, h, w = cols.shape[:4]
    cols = cols.permute(0, 2, 3, 1, 4, 5).reshape(s * h * w, c * 9)  # rows (s, h, w), features (c, kh, kw)
    return F.linear(cols, conv.weight.view(conv.out_channels, -1), conv.bias).view(s, h, w, -1)


class AuTTower(nn.Module):
    """Conv front end, encoder layers and ln_post: mel chunks + packing rows -> hidden [W*R, d]."""

    def __init__(self, cfg: AuTConfig):
        super().__init__()
        self.cfg = cfg
        c = cfg.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, c, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(c, c, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(c, c, 3, 2, padding=1)
        self.conv_out = nn.Linear(c * cfg.conv_freq_bins, cfg.d_model, bias=False)
        self.layers = nn.ModuleList(EncoderLayer(cfg.layer_config()) for _ in range(cfg.encoder_layers))
        self.ln_post = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        # Only a chunk's T positions are ever used, so the table stops there (HF keeps 1500 rows).
        self.register_buffer("positional_embedding", sinusoids(cfg.chunk_tokens, cfg.d_model), persistent=False)

    def _convs(self, x: torch.Tensor) -> torch.Tensor:
        """[S, 1, n_mels, F] -> [S, f, T, c] (channels last)."""
        y = F.gelu(conv_s2(x, self.conv2d1))
        y = F.gelu(conv_s2(y.permute(0, 3, 1, 2), self.conv2d2))
        return F.gelu(conv_s2(y.permute(0, 3, 1, 2), self.conv2d3))

    def front_end(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [S, n_mels, F] -> chunk tokens [S, T, d], position embedding added per chunk."""
        x = mel.to(self.conv2d1.weight.dtype).unsqueeze(1)                  # [S, 1, n_mels, F]
        group = min(self.cfg.conv_chunksize, CONV_GROUP)                    # static split: S is the step's
        parts = [self._convs(p) for p in x.split(group)]
        x = parts[0] if len(parts) == 1 else torch.cat(parts)               # [S, f, T, c]
        s, f, t, c = x.shape
        x = self.conv_out(x.permute(0, 2, 3, 1).reshape(s, t, c * f))      # [S, T, d], features (c, f)
        return x + self.positional_embedding.to(x.dtype)                    # positions restart every chunk

    def encode(self, mel: torch.Tensor, rows: torch.Tensor, attn) -> torch.Tensor:
        x = self.front_end(mel)
        x = x.reshape(-1, x.shape[-1]).index_select(0, rows)                # [W*R, d] packed rows
        for layer in self.layers:
            x = layer(x, attn)
        return self.ln_post(x)


class AuTEncoder(AuTTower, NodeModule):
    """Node (Omni / QwenLM names): mel [W*C, n_mels, F], rows [W*R] -> embeds [W*R, output_dim]."""

    ROLES = {"attn": "ragged_attention"}

    def __init__(self, cfg: AuTConfig):
        super().__init__(cfg)
        self.proj1 = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj2 = nn.Linear(cfg.d_model, cfg.output_dim)

    def forward(self, ctx: StepContext, mel: torch.Tensor, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.encode(mel, rows, ctx["attn"])
        return {"embeds": self.proj2(F.gelu(self.proj1(x)))}


class AuTProjectorHF(nn.Module):
    """Qwen3-ASR -hf's multi_modal_projector: proj1/proj2 under other names."""

    def __init__(self, cfg: AuTConfig):
        super().__init__()
        self.linear_1 = nn.Linear(cfg.d_model, cfg.d_model)
        self.linear_2 = nn.Linear(cfg.d_model, cfg.output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.gelu(self.linear_1(x)))


class AuTEncoderHF(NodeModule):
    """Node (Qwen3-ASR -hf names, prefix "model."): the same ports and numerics as AuTEncoder."""

    ROLES = {"attn": "ragged_attention"}

    def __init__(self, cfg: AuTConfig):
        super().__init__()
        self.audio_tower = AuTTower(cfg)
        self.multi_modal_projector = AuTProjectorHF(cfg)

    def forward(self, ctx: StepContext, mel: torch.Tensor, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"embeds": self.multi_modal_projector(self.audio_tower.encode(mel, rows, ctx["attn"]))}


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
