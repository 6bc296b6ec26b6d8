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
from torch import nn

from graphc import NodeModule, StepContext
from models.components.aut_config import QWEN3_ASR_0_6B_AUT, QWEN3_ASR_1_7B_AUT, QWEN3_OMNI_AUT, AuTConfig, \
    attention_spec, conv3_len, conv_len, node_ports  # noqa: F401
from models.components.encoder import EncoderLayer


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
