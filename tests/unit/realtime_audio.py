"""Speech-like test audio for the realtime tests: a voiced signal (a pitch contour's harmonics shaped by
vowel formants, in syllables) that Silero's VAD takes for speech, with silence around it."""
import base64

import numpy as np

RATE = 24_000                     # the realtime wire's rate
VOWELS = [(700, 1220, 2600), (300, 2300, 3000), (500, 900, 2400), (400, 1900, 2550), (600, 1000, 2500)]


def voiced(seconds: float, rate: int = RATE) -> np.ndarray:
    """float32 speech-like audio: 130 Hz +- 25 Hz harmonics through a vowel's three formants, a vowel every
    0.22 s syllable."""
    t = np.arange(int(seconds * rate)) / rate
    syllable = 0.22
    f0 = 130 + 25 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    formants = np.array(VOWELS, float)[(t // syllable).astype(int) % len(VOWELS)]
    y = np.zeros(len(t))
    for k in range(1, 30):
        gain = sum(1 / (1 + ((k * f0 - formants[:, j]) / (80 + 40 * j)) ** 2) for j in range(3)) / k ** 0.5
        y += gain * np.sin(k * phase)
    y *= np.sin(np.pi * (t % syllable) / syllable) ** 0.6
    return (0.3 * y / np.abs(y).max()).astype(np.float32)


def turn(before_s: float, speech_s: float, after_s: float, rate: int = RATE) -> np.ndarray:
    """Silence, speech, silence."""
    return np.concatenate([np.zeros(int(before_s * rate), np.float32), voiced(speech_s, rate),
                           np.zeros(int(after_s * rate), np.float32)])


def pcm16_b64(samples: np.ndarray) -> str:
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


def chunks(samples: np.ndarray, ms: int = 20, rate: int = RATE) -> list[str]:
    """The audio as base64 pcm16 appends of `ms` milliseconds each."""
    n = rate * ms // 1000
    return [pcm16_b64(samples[i:i + n]) for i in range(0, len(samples), n)]
