"""Realtime audio on the wire: 24 kHz mono pcm16 (little-endian) in base64, both ways. The input is
resampled to the audio encoder's 16 kHz as it arrives, the speech out from the plan's rate to 24 kHz (soxr's
streaming resampler: chunks join as one signal)."""
from __future__ import annotations

import base64
import binascii

import numpy as np

from graphc.errors import InvalidInput
from graphc.serve.audio_out import pcm16

WIRE_RATE = 24_000            # what clients send and hear


def decode_pcm16(data, param: str = "audio") -> np.ndarray:
    """base64 pcm16 as float32 samples in [-1, 1); InvalidInput when it is not."""
    if not isinstance(data, str):
        raise InvalidInput(f"{param} must be a base64 string", f"got {type(data).__name__}",
                           "send 24 kHz mono pcm16, base64-encoded", param=param)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"{param} is not valid base64", "", "send 24 kHz mono pcm16, base64-encoded",
                           param=param) from None
    if len(raw) % 2:
        raise InvalidInput(f"{param} holds {len(raw)} bytes", "pcm16 is 2 bytes a sample",
                           "send whole 16-bit samples", param=param)
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0


def encode_pcm16(samples: np.ndarray) -> str:
    return base64.b64encode(pcm16(samples)).decode()


class Resampler:
    """A stream of chunks from one rate to another; the same rates pass through."""

    def __init__(self, rate_in: int, rate_out: int):
        self.stream = None
        if rate_in != rate_out:
            import soxr
            self.stream = soxr.ResampleStream(rate_in, rate_out, 1, dtype="float32", quality="HQ")

    def __call__(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        if self.stream is None:
            return samples
        return self.stream.resample_chunk(samples, last=last)
