"""Audio a client receives: float samples in [-1, 1] encoded as the format it asked for.

Formats: wav and pcm16 (16-bit little-endian mono; OpenAI's 'pcm' is the same) are written here and
stream chunk by chunk: a streamed WAV's header declares the largest sizes (0xFFFFFFFF), as live WAV
streams do, and readers take the data to the end of the file. flac, mp3 and opus (in Ogg) are encoded
by libsndfile through soundfile, whole, once the speech has ended.
"""
from __future__ import annotations

import io
import struct

import numpy as np

from graphc.errors import InvalidInput

MEDIA_TYPES = {"wav": "audio/wav", "pcm16": "audio/pcm", "pcm": "audio/pcm", "flac": "audio/flac",
               "mp3": "audio/mpeg", "opus": "audio/ogg"}
STREAMED = ("wav", "pcm16", "pcm")
SOUNDFILE = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}


def check_format(fmt: str, stream: bool = False, param: str = "format") -> str:
    """fmt when it is served (and streams, when `stream`), else InvalidInput naming `param`."""
    if fmt not in MEDIA_TYPES:
        raise InvalidInput(f"audio format '{fmt}' is not served", f"formats: {', '.join(MEDIA_TYPES)}",
                           "ask for one of them", param=param)
    if stream and fmt not in STREAMED:
        raise InvalidInput(f"audio format '{fmt}' cannot be streamed", f"streamed formats: {', '.join(STREAMED)}",
                           f"ask for one of them, or {fmt} without streaming", param=param)
    return fmt


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def wav_header(rate: int, frames: int | None) -> bytes:
    """A mono 16-bit PCM WAV header; frames None: a stream of unknown length."""
    data = 0xFFFFFFFF if frames is None else 2 * frames
    riff = 0xFFFFFFFF if frames is None else 36 + data
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, 2 * rate, 2, 16)
            + b"data" + struct.pack("<I", data))


def whole(chunks: list[np.ndarray]) -> np.ndarray:
    """The chunks of a waveform as one (no chunk: no samples)."""
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def encode(samples: np.ndarray, rate: int, fmt: str) -> bytes:
    """The whole waveform in `fmt`."""
    check_format(fmt)
    if fmt == "wav":
        return wav_header(rate, len(samples)) + pcm16(samples)
    if fmt in ("pcm16", "pcm"):
        return pcm16(samples)
    import soundfile as sf

    container, subtype = SOUNDFILE[fmt]
    out = io.BytesIO()
    sf.write(out, np.asarray(samples, dtype=np.float32), rate, format=container, subtype=subtype)
    return out.getvalue()


class Stream:
    """Chunks of a streamed wav or pcm16: add(samples) gives the bytes to send next."""

    def __init__(self, fmt: str, rate: int):
        check_format(fmt, stream=True)
        self.fmt, self.rate, self.started = fmt, rate, False

    def add(self, samples: np.ndarray) -> bytes:
        head = b""
        if not self.started and self.fmt == "wav":
            head = wav_header(self.rate, None)
        self.started = True
        return head + pcm16(samples)
