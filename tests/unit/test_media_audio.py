"""Audio loading against signals whose samples are known: a sine at another rate must come out as
the same sine at 16 kHz, integer PCM as its value over 2^15, channels as their mean."""
from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from graphc.runtime.media import MediaError, load_audio


def encode(wave: np.ndarray, rate: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, wave, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def sine(freq: float, rate: int, seconds: float, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return amp * np.sin(2 * np.pi * freq * t)


@pytest.mark.parametrize("rate, fmt", [(44_100, "WAV"), (48_000, "FLAC"), (8_000, "WAV"), (22_050, "OGG")])
def test_a_sine_at_any_rate_is_the_same_sine_at_16khz(rate, fmt):
    wave = load_audio(encode(sine(440.0, rate, 1.0), rate, fmt), 16_000)
    assert wave.dtype == np.float32 and abs(wave.shape[0] - 16_000) <= 1
    want = sine(440.0, 16_000, wave.shape[0] / 16_000)
    mid = slice(800, wave.shape[0] - 800)            # away from the filter's edges
    tol = 0.03 if fmt == "OGG" else 2e-3             # Vorbis is lossy
    assert np.abs(wave[mid] - want[mid]).max() < tol


def test_16bit_pcm_at_16khz_is_its_value_over_32768():
    pcm = (np.random.default_rng(0).integers(-32768, 32767, 1600)).astype(np.int16)
    wave = load_audio(encode(pcm, 16_000, subtype="PCM_16"))
    np.testing.assert_array_equal(wave, pcm.astype(np.float32) / 32768)


def test_channels_are_averaged():
    left, right = sine(300.0, 16_000, 0.5), sine(700.0, 16_000, 0.5, amp=0.25)
    wave = load_audio(encode(np.stack([left, right], axis=1), 16_000, subtype="FLOAT"))
    np.testing.assert_allclose(wave, (left + right) / 2, atol=1e-7)


def test_a_file_path_works(tmp_path):
    path = tmp_path / "a.wav"
    path.write_bytes(encode(sine(440.0, 16_000, 0.25), 16_000, subtype="FLOAT"))
    np.testing.assert_allclose(load_audio(path), sine(440.0, 16_000, 0.25), atol=1e-7)


def test_bytes_that_are_not_audio_are_refused():
    with pytest.raises(MediaError, match="does not decode.*send WAV, FLAC, OGG or MP3"):
        load_audio(b"RIFF\x00\x00not really a wave file" * 10)


def test_an_empty_audio_is_refused():
    with pytest.raises(MediaError, match="holds no samples"):
        load_audio(encode(np.zeros(0), 16_000))


def test_too_long_is_refused_from_the_header_before_decoding(monkeypatch):
    data = encode(np.zeros(16_000 * 3), 16_000)

    def no_decoding(*a, **k):
        raise AssertionError("decoded a clip that the header already shows too long")

    monkeypatch.setattr(sf, "read", no_decoding)
    with pytest.raises(MediaError, match=r"3\.0 s long, at most 2\.5 s"):
        load_audio(data, max_seconds=2.5)
