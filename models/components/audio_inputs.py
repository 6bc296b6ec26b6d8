"""Host-side inputs of the AuT encoder node: waveform -> log-mel, and audios -> one step of W windows.

A runtime building an audio step:
    mels = [log_mel(wave) for wave in waves]                 # [n_mels, L_a] each
    step = pack_audios(mels, W, cfg)                         # refuses more than W windows
    attn = RaggedTorch(spec, step.cu_seqlens)                # or a GPU backend planned on the same cu_seqlens
    embeds = node(StepContext({"attn": attn}), mel=step.mel, rows=step.rows)["embeds"]
    audio a's tokens: embeds[step.offsets[a] : step.offsets[a] + step.num_tokens[a]]
num_windows(frames, cfg) says how many windows an audio takes, for a scheduler filling W.
The layout itself is documented in models/components/aut.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np
import torch

from models.components.aut import AuTConfig, conv3_len

SAMPLE_RATE = 16_000
HOP_LENGTH = 160     # 10 ms per mel frame
N_FFT = 400


MAX_HZ = SAMPLE_RATE / 2
LOG_RANGE = 8.0      # log10 units kept below the loudest bin


def _hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
    """Slaney's mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above."""
    log_step = 27.0 / math.log(6.4)
    return torch.where(hz < 1000.0, 3.0 * hz / 200.0, 15.0 + torch.log(hz.clamp(min=1e-10) / 1000.0) * log_step)


def _mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    log_step = 27.0 / math.log(6.4)
    return torch.where(mel < 15.0, 200.0 * mel / 3.0, 1000.0 * torch.exp((mel - 15.0) / log_step))


@lru_cache(maxsize=4)
def mel_filters(n_mels: int) -> torch.Tensor:
    """[n_mels, N_FFT // 2 + 1] float32: triangles evenly spaced on Slaney's mel scale from 0 to 8 kHz,
    each scaled to unit area (Slaney norm), as Whisper's feature extractor builds them (in float64)."""
    edges = _mel_to_hz(torch.linspace(0.0, float(_hz_to_mel(torch.tensor(MAX_HZ, dtype=torch.float64))),
                                      n_mels + 2, dtype=torch.float64))
    freqs = torch.linspace(0.0, SAMPLE_RATE // 2, N_FFT // 2 + 1, dtype=torch.float64)
    width = edges.diff()
    slopes = edges[None, :] - freqs[:, None]                       # [bins, n_mels + 2]
    down = -slopes[:, :-2] / width[:-1]
    up = slopes[:, 2:] / width[1:]
    bank = torch.clamp(torch.minimum(down, up), min=0.0)          # [bins, n_mels]
    bank = bank * (2.0 / (edges[2:] - edges[:-2]))[None, :]
    return bank.T.to(torch.float32).contiguous()


def log_mel(waveform: np.ndarray | torch.Tensor, n_mels: int = 128, min_samples: int = 0) -> torch.Tensor:
    """A mono 16 kHz waveform [n] -> Whisper-style log-mel features [n_mels, max(n, min_samples) // 160] fp32.

    Whisper's recipe in torch: a 400-sample periodic Hann window every 160 samples (centred, reflect
    padded), power spectrum, the mel filters above, log10 floored at 1e-10, everything under the
    loudest value less 8 raised to it, then (x + 4) / 4. tests/parity checks it against HF's extractor.
    min_samples: zero-pad shorter clips first (Qwen3-ASR's extractor uses 8000, i.e. 0.5 s; Omni's 0).
    Each audio is extracted alone, so its features do not depend on what it is batched with.
    """
    wave = torch.as_tensor(np.asarray(waveform, dtype=np.float32) if not isinstance(waveform, torch.Tensor)
                           else waveform, dtype=torch.float32).reshape(-1).cpu()
    if wave.shape[0] < min_samples:
        wave = torch.nn.functional.pad(wave, (0, min_samples - wave.shape[0]))
    if wave.shape[0] <= N_FFT // 2:
        raise ValueError(f"a waveform of {wave.shape[0]} samples is too short for log-mel features: it needs more "
                         f"than {N_FFT // 2} ({N_FFT // 2 / SAMPLE_RATE * 1000:.1f} ms at {SAMPLE_RATE} Hz)")
    stft = torch.stft(wave, N_FFT, HOP_LENGTH, window=torch.hann_window(N_FFT), return_complex=True)
    power = (stft[..., :-1].abs() ** 2).contiguous()              # the last frame is dropped
    logs = torch.clamp(mel_filters(n_mels) @ power, min=1e-10).log10()
    logs = torch.maximum(logs, logs.max() - LOG_RANGE)
    return ((logs + 4.0) / 4.0)[:, : wave.shape[0] // HOP_LENGTH]


def num_tokens(frames: int, cfg: AuTConfig) -> int:
    """Output tokens of an audio of `frames` mel frames: T per full chunk, ceil^3(r/2) for r left over."""
    full, rest = divmod(frames, cfg.chunk_frames)
    return full * cfg.chunk_tokens + conv3_len(rest)


def window_lengths(frames: int, cfg: AuTConfig) -> list[int]:
    """Attention windows of one audio: R tokens each, then the remainder (e.g. 30 s: [104, 104, 104, 78])."""
    full, rest = divmod(num_tokens(frames, cfg), cfg.window_tokens)
    return [cfg.window_tokens] * full + ([rest] if rest else [])


def num_windows(frames: int, cfg: AuTConfig) -> int:
    return len(window_lengths(frames, cfg))


@dataclass(frozen=True)
class AudioStep:
    """One step of the AuT node for W windows (layout: models/components/aut.py)."""

    mel: torch.Tensor        # [W*C, n_mels, F] float32 chunk slots
    rows: torch.Tensor       # [W*R] int64: packed row -> post-conv grid row
    cu_seqlens: list[int]    # the real windows' boundaries in the packed rows: [0, ..., N]
    num_tokens: list[int]    # output tokens per audio
    offsets: list[int]       # each audio's first row in embeds; its rows are contiguous


def pack_audios(mels: Sequence[torch.Tensor], windows: int, cfg: AuTConfig) -> AudioStep:
    """Pack audios (mel [n_mels, L] each, in order) into one step of `windows` windows."""
    need = sum(num_windows(m.shape[-1], cfg) for m in mels)
    if need > windows:
        raise ValueError(f"the audios take {need} windows, the step holds {windows}; cut long audios at "
                         f"multiples of n_window_infer ({cfg.n_window_infer}) frames or use another step")
    f, t = cfg.chunk_frames, cfg.chunk_tokens
    mel = torch.zeros(windows * cfg.chunks_per_window, cfg.num_mel_bins, f)
    real: list[int] = []
    cu, counts, offsets = [0], [], []
    slot = 0
    for m in mels:
        if m.dim() != 2 or m.shape[0] != cfg.num_mel_bins or m.shape[1] < 1:
            raise ValueError(f"each mel must be [{cfg.num_mel_bins}, L >= 1], got {list(m.shape)}")
        offsets.append(cu[-1])
        for start in range(0, m.shape[1], f):
            chunk = m[:, start:start + f]
            mel[slot, :, :chunk.shape[1]] = chunk
            real.extend(range(slot * t, slot * t + conv3_len(chunk.shape[1])))
            slot += 1
        counts.append(num_tokens(m.shape[1], cfg))
        for n in window_lengths(m.shape[1], cfg):
            cu.append(cu[-1] + n)
    rows = torch.tensor(real, dtype=torch.int64)
    padding = torch.ones(windows * cfg.window_tokens, dtype=torch.bool)
    padding[rows] = False
    rows = torch.cat([rows, padding.nonzero().flatten()])
    return AudioStep(mel=mel, rows=rows, cu_seqlens=cu, num_tokens=counts, offsets=offsets)
