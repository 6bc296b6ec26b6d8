"""Qwen3-Omni's Code2Wav vocoder as a serving node: codec codes -> 24 kHz waveform.

Pipeline (HF Qwen3OmniMoeCode2Wav): embed code + codebook_size*q in one table and average over
the quantizers; a causal sliding-window transformer (RMSNorm, rotary, LayerScale on both
residual branches, SwiGLU); 2 x (ConvTranspose k=s=r, ConvNeXt) upsampling; a decoder of
CausalConv k7, 4 blocks of (SnakeBeta, ConvTranspose k=2r s=r, 3 dilated residual units),
SnakeBeta, CausalConv -> 1 channel, clamp to [-1, 1]. Weight names are the checkpoint's minus
the 'code2wav.' prefix.

Step layout. The capture axis "frames" counts codec frames; a step decodes `seqs` chunks ("slots")
of L = frames/seqs frames each (a chunk walk's slot: its frames budget over its seqs budget, at most
chunk_frames), packed slot after slot, with the code frames each slot holds:
  codes [frames, num_quantizers] int, filled [seqs] int  ->  wav [frames * U] fp32
wav is slot after slot, U*L samples each: a slot's first samples(filled) samples are its audio, the
rest zero. The transformer runs on the packed rows [frames, hidden] with one attention segment per
slot (cu_seqlens = 0, L, 2L, ...), rotary positions restarting at 0 in each slot; the convolutions
run on [slots, channels, time], so nothing leaks between slots (each is zero-padded on its own,
like a separate HF call). A model may declare several chunk walks of different slot lengths (short
slots for a request's first frames, long ones after): a slot costs its full length.

Chunked decoding (HF chunked_decode: 300 new frames with 25 frames of left context) maps onto
slots of chunk_frames = 325: plan_chunks() gives, per slot, which code frames fill it and which
samples of its output row are new audio. Right-padding a slot does not change its real samples:
every stage is causal except that the transposed convolutions look one input frame ahead, and
their right trim removes exactly the samples that would (HF's output for n frames is
samples(n) = U*n - tail long, U = 1920, tail = 555 for the real rates). So a slot with n real
frames reproduces HF's call on those n frames in its first samples(n) samples.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from graphc import NodeModule, StepContext
from models.components.code2wav_config import Code2WavConfig, attention_spec, ports  # noqa: F401
from models.components.layers import RMSNorm, SwiGLU, apply_rope, rope_cos_sin, rope_inv_freq


# ---- the pre-transformer --------------------------------------------------------------------------

class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class Code2WavAttention(nn.Module):
    def __init__(self, cfg: Code2WavConfig):
        super().__init__()
        self.h, self.kv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv * self.d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn) -> torch.Tensor:
        t = x.shape[0]
        q = apply_rope(self.q_proj(x).view(t, self.h, self.d), cos, sin)    # [R, H, D]
        k = apply_rope(self.k_proj(x).view(t, self.kv, self.d), cos, sin)   # [R, KV, D]
        v = self.v_proj(x).view(t, self.kv, self.d)
        return self.o_proj(attn(q, k, v).reshape(t, self.h * self.d))


class Code2WavLayer(nn.Module):
    def __init__(self, cfg: Code2WavConfig):
        super().__init__()
        d = cfg.hidden_size
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.self_attn = Code2WavAttention(cfg)
        self.self_attn_layer_scale = LayerScale(d)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.mlp = SwiGLU(d, cfg.intermediate_size)
        self.mlp_layer_scale = LayerScale(d)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, attn))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Code2WavTransformer(nn.Module):
    def __init__(self, cfg: Code2WavConfig):
        super().__init__()
        self.layers = nn.ModuleList(Code2WavLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn) -> torch.Tensor:
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)         # [R, 1, D]
        for layer in self.layers:
            x = layer(x, cos, sin, attn)
        return self.norm(x)


# ---- convolutions on [slots, channels, time] ------------------------------------------------------

class CausalConv(nn.Module):
    """Stride-1 conv padded (k-1)*dilation zeros on the left only: output length = input length."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.pad = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.pad, 0)))


class CausalTransConv(nn.Module):
    """ConvTranspose (kernel k, stride s) trimmed k-s samples at both ends, as HF does."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., self.trim: y.shape[-1] - self.trim]


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dwconv(x).transpose(1, 2))                       # [B, T, C]
        y = self.gamma * self.pwconv2(F.gelu(self.pwconv1(y)))
        return x + y.transpose(1, 2)


class SnakeBeta(nn.Module):
    """x + 1/exp(beta) * sin^2(x * exp(alpha)), per channel (log-scale parameters)."""

    # a kernel choice the plan makes (select_backends' fused_norms knob, set at boot and in the simulation):
    # 1 runs bf16 activations on a GPU (and on meta tensors) as one launch (norm_ops.snake_beta, fp32 inside,
    # rounded once) in place of torch's nine; 0: torch's ops
    fused_norms: int = 0

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_norms and x.dtype == torch.bfloat16 and x.dim() == 3 and x.device.type in ("cuda", "meta"):
            from models.components.norm_ops import snake_beta
            return snake_beta(x, self.alpha, self.beta)
        alpha = self.alpha.exp()[None, :, None]
        beta = self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)     # HF's epsilon and op order


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        self.block = nn.Sequential(SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate),
                                   *(ResidualUnit(cout, d) for d in (1, 3, 9)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def _decoder(cfg: Code2WavConfig) -> nn.Sequential:
    dims = [cfg.decoder_dim // 2 ** i for i in range(len(cfg.upsample_rates) + 1)]   # 1536 -> ... -> 96
    blocks = [DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)]
    return nn.Sequential(CausalConv(cfg.hidden_size, dims[0], 7), *blocks,
                         SnakeBeta(dims[-1]), CausalConv(dims[-1], 1, 7))


# ---- the node -------------------------------------------------------------------------------------

class Code2Wav(NodeModule):
    """Node: codes [frames, Q] in `seqs` slots of L frames, filled [seqs] -> wav [frames * U] fp32.

    The attention role is a causal ragged attention with window sliding_window and one segment per
    slot (see attention_spec and cu_seqlens).
    """

    ROLES = {"attn": "ragged_attention"}

    def __init__(self, cfg: Code2WavConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.code_embedding = nn.Embedding(cfg.codebook_size * cfg.num_quantizers, h)
        self.register_buffer("code_offset", torch.arange(cfg.num_quantizers) * cfg.codebook_size, persistent=False)
        self.pre_transformer = Code2WavTransformer(cfg)
        self.upsample = nn.ModuleList(nn.Sequential(CausalTransConv(h, h, r, r), ConvNeXtBlock(h))
                                      for r in cfg.upsampling_ratios)
        self.decoder = _decoder(cfg)

    def forward(self, ctx: StepContext, codes: torch.Tensor, filled: torch.Tensor) -> dict[str, torch.Tensor]:
        rows, slots, u = codes.shape[0], filled.shape[0], self.cfg.total_upsample
        chunk = rows // slots
        if rows % slots or chunk > self.cfg.chunk_frames:
            raise ValueError(f"{rows} code frames do not make {slots} slots of at most {self.cfg.chunk_frames} "
                             "frames; a chunk walk's rungs must be whole slots")
        x = self.code_embedding(codes + self.code_offset).mean(1)          # [R, Q, H] -> [R, H]
        positions = torch.arange(chunk, device=codes.device).repeat(slots)  # every slot starts at 0
        x = self.pre_transformer(x, positions, ctx["attn"])                 # [R, H]
        x = x.view(slots, chunk, -1).transpose(1, 2)                        # [B, H, L]
        for up in self.upsample:
            x = up(x)                                                       # [B, H, L * prod(ratios)]
        wav = F.pad(self.decoder(x)[:, 0], (0, self.cfg.tail))              # [B, U*L]
        keep = torch.arange(u * chunk, device=codes.device) < (u * filled - self.cfg.tail)[:, None]
        return {"wav": (wav.clamp(-1, 1) * keep).float().flatten()}


# ---- host side: how a runtime fills slots and trims their output ----------------------------------

def cu_seqlens(slot_frames: int, slots: int) -> list[int]:
    """Attention segments of a step of `slots` slots of slot_frames: one per slot (padding slots included)."""
    return [i * slot_frames for i in range(slots + 1)]


@dataclass(frozen=True)
class Slot:
    """One chunk of a request: code frames [start, start + frames) fill the slot's first rows (the
    rest is padding); samples [keep_start, keep_stop) of the slot's wav row are new audio."""

    start: int
    frames: int
    keep_start: int
    keep_stop: int


def plan_chunks(cfg: Code2WavConfig, num_frames: int) -> list[Slot]:
    """HF chunked_decode's chunks (chunk_frames - left_context new frames, up to left_context of
    context) as slots; concatenating each slot's kept samples equals HF's chunked_decode output.
    Like HF, this drops the last samples(n)-vs-U*n tail (555 samples, 23 ms) at every chunk end."""
    new = cfg.chunk_frames - cfg.left_context
    out, start = [], 0
    while start < num_frames:
        end = min(start + new, num_frames)
        context = cfg.left_context if start - cfg.left_context > 0 else start   # HF's rule, verbatim
        out.append(Slot(start=start - context, frames=end - start + context,
                        keep_start=context * cfg.total_upsample, keep_stop=cfg.samples(end - start + context)))
        start = end
    return out


def pack_slots(cfg: Code2WavConfig, filled: list[tuple[torch.Tensor, Slot]], total_slots: int,
               slot_frames: int | None = None) -> dict[str, torch.Tensor]:
    """(codes [Q, T] of a request, one of its slots) per slot, any mix of requests -> the step's
    inputs: codes [total_slots * slot_frames, Q] (slot_frames: the walk's slot, chunk_frames by
    default) and filled [total_slots]. Unfilled rows hold code 0: in a filled slot they only feed
    samples past keep_stop, and unfilled slots are dropped."""
    n = slot_frames or cfg.chunk_frames
    step = torch.zeros(total_slots * n, cfg.num_quantizers, dtype=torch.int64)
    lengths = torch.zeros(total_slots, dtype=torch.int64)
    for i, (codes, s) in enumerate(filled):
        if s.frames > n:
            raise ValueError(f"a chunk of {s.frames} frames does not fit a {n}-frame slot")
        step[i * n: i * n + s.frames] = codes[:, s.start: s.start + s.frames].T
        lengths[i] = s.frames
    return {"codes": step, "filled": lengths}


def stream_chunk_frames(cfg: Code2WavConfig, index: int, first: int) -> int:
    """New frames of a request's `index`-th streamed chunk: `first`, doubling, up to what a slot holds
    (all chunk_frames for the first chunk, which has no left context; chunk_frames - left_context after)."""
    return min(first << min(index, 30), cfg.chunk_frames - (cfg.left_context if index else 0))


def stream_slot(cfg: Code2WavConfig, start: int, end: int) -> Slot:
    """The slot that streams new frames [start, end) of a request, with up to left_context frames of
    left context, and the samples of its output that continue the waveform without a gap.

    A slot of n frames gives samples(n) = U*n - tail samples: its last `tail` samples would need the
    next frame (the transposed convolutions look one frame ahead), so a chunk stops there and the next
    chunk, which holds that frame, starts its kept samples `tail` early, inside its left context.
    Concatenated, the chunks give U*N - tail samples for N frames, the length of one HF call on all
    of them. HF's chunked_decode instead drops those `tail` samples at every chunk boundary (555
    samples, 23 ms, for the real rates): a gap graphc does not serve."""
    if not 0 <= start < end or end - start > cfg.chunk_frames - min(cfg.left_context, start):
        raise ValueError(f"frames [{start}, {end}) do not fit one {cfg.chunk_frames}-frame slot "
                         f"beside {min(cfg.left_context, start)} context frames")
    context = min(cfg.left_context, start)
    n = context + end - start
    if start and context * cfg.total_upsample < cfg.tail:
        raise ValueError(f"left_context {cfg.left_context} is too short to cover the {cfg.tail}-sample tail")
    keep_start = context * cfg.total_upsample - (cfg.tail if start else 0)
    return Slot(start=start - context, frames=n, keep_start=keep_start, keep_stop=cfg.samples(n))
