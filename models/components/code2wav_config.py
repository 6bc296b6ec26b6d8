"""Code2Wav's declaration half (models/components/code2wav.py): its config (HF names), its attention resource
and the node's ports. No torch (see thinker_config.py)."""
from __future__ import annotations

import math

from pydantic import Field, model_validator

import graphc as gc
from graphc import Strict
from resources.ragged_attention import RaggedAttentionSpec


SAMPLE_RATE = 24_000        # Hz of the audio Code2Wav makes (the released model: 12.5 frames a second x 1920)


class Code2WavConfig(Strict):
    """HF's Qwen3OmniMoeCode2WavConfig fields; defaults are the released 30B-A3B values."""

    codebook_size: int = Field(2048, ge=1)
    num_quantizers: int = Field(16, ge=1)
    hidden_size: int = Field(1024, ge=1)
    num_hidden_layers: int = Field(8, ge=1)
    num_attention_heads: int = Field(16, ge=1)
    num_key_value_heads: int = Field(16, ge=1)
    intermediate_size: int = Field(3072, ge=1)
    sliding_window: int | None = Field(72, ge=1)   # keys per query, itself included; None: full causal
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    upsampling_ratios: tuple[int, ...] = (2, 2)
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    decoder_dim: int = Field(1536, ge=1)
    chunk_frames: int = Field(325, ge=1)           # frames of the longest slot, left context included
    left_context: int = Field(25, ge=0)            # context frames before each chunk's new frames

    @model_validator(mode="after")
    def _shapes(self) -> "Code2WavConfig":
        if self.hidden_size % self.num_attention_heads or (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(f"hidden_size {self.hidden_size} must split into {self.num_attention_heads} even heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.decoder_dim % 2 ** len(self.upsample_rates):
            raise ValueError(f"decoder_dim {self.decoder_dim} must halve {len(self.upsample_rates)} times")
        if self.left_context >= self.chunk_frames:
            raise ValueError(f"left_context {self.left_context} leaves no new frames "
                             f"in a {self.chunk_frames}-frame slot")
        if any(r < 1 for r in self.upsampling_ratios + self.upsample_rates):
            raise ValueError("upsampling ratios and rates must be >= 1")
        if self.samples(1) < 1:
            raise ValueError("these upsample rates leave no samples for a one-frame chunk")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def total_upsample(self) -> int:
        """Samples per codec frame (1920 for the real model: 24 kHz at 12.5 Hz)."""
        return math.prod(self.upsampling_ratios + self.upsample_rates)

    def samples(self, frames: int) -> int:
        """Waveform length HF produces for `frames` codec frames: each k=2r, s=r transposed conv
        trims r samples at both ends, so L -> (L - 1) * r."""
        n = frames * math.prod(self.upsampling_ratios)
        for r in self.upsample_rates:
            n = (n - 1) * r
        return n

    @property
    def samples_per_chunk(self) -> int:
        return self.samples(self.chunk_frames)

    @property
    def tail(self) -> int:
        """samples(n) = U*n - tail for every n >= 1: the samples the last frame still owes the next."""
        return self.total_upsample - self.samples(1)


def attention_spec(cfg: Code2WavConfig, name: str, **kw) -> RaggedAttentionSpec:
    """The resource the node's "attn" role binds: causal, sliding window, segments of one slot.

    RaggedAttentionSpec's window counts the keys a query sees including itself, the same as HF's
    sliding_window (a key is seen when q - window < k <= q)."""
    return RaggedAttentionSpec(name=name, num_heads=cfg.num_attention_heads, head_dim=cfg.head_dim,
                               num_kv_heads=cfg.num_key_value_heads, max_segment=cfg.chunk_frames,
                               causal=True, window=cfg.sliding_window, **kw)


def ports(cfg: Code2WavConfig, codes_dtype: str = "int64") -> tuple[dict[str, gc.Port], dict[str, gc.Port]]:
    """The node's inputs and outputs on the "frames" axis (frames = seqs slots * the slot length)."""
    inputs = {"codes": gc.Port(shape=("frames", cfg.num_quantizers), dtype=codes_dtype),
              "filled": gc.Port(shape=("seqs",), dtype="int64")}
    outputs = {"wav": gc.Port(shape=(f"frames*{cfg.total_upsample}",), dtype="float32")}
    return inputs, outputs
