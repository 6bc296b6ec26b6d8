"""The server VAD's two Silero states half a window apart (graphc/serve/realtime/vad.py), with stand-in models whose
probability is the share of a window's samples that are voiced (1.0) or that record what they were given. Expected
values are worked by hand from the signal: a window of 512 samples ending on the 256-sample grid is speech when at
least half of it is voiced (threshold 0.5)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from graphc.serve.realtime.vad import HOP, WINDOW, Vad

PAD, SILENCE_MS = 300 * 16, 500          # prefix_padding_ms 300 at 16 kHz; silence_duration_ms 500
SILENCE = SILENCE_MS * 16


class Voiced:
    """Speech probability: the share of the window's samples that are 1.0; remembers each window's first sample."""

    def __init__(self):
        self.firsts: list[float] = []

    def process(self, window: memoryview) -> float:
        x = np.frombuffer(window, np.float32)
        self.firsts.append(float(x[0]))
        return float((x == 1.0).mean())


def run(signal: np.ndarray, chunks: list[int]) -> tuple[list[tuple[int, int, int | None]], Vad]:
    """Feed the signal in chunks; (samples fed when reported, start, stop) of each report."""
    vad, fed, out = Vad((Voiced(), Voiced()), 0.5, 300, SILENCE_MS), 0, []
    for n in chunks:
        part = signal[fed:fed + n]
        fed += len(part)
        out += [(fed, t.start, t.stop) for t in vad.feed(part)]
    return out, vad


def voiced(length: int, start: int, end: int) -> np.ndarray:
    x = np.zeros(length, np.float32)
    x[start:end] = 1.0
    return x


def grid_at_or_after(x: int) -> int:
    """The first window end (512, 768, 1024, ...) at or after x."""
    return max(WINDOW, HOP * math.ceil(x / HOP))


@pytest.mark.parametrize("onset,chunks", [(300, [320]), (4000, [320]), (4000, [1] * 7 + [999, 4096]), (8192, [10_000])])
def test_speech_starts_at_the_first_half_voiced_window_of_either_state(onset, chunks):
    signal = voiced(40_000, onset, 20_000)
    reports, _ = run(signal, chunks * (40_000 // sum(chunks) + 1))
    end = grid_at_or_after(onset + WINDOW // 2)          # its window holds >= 256 voiced samples
    fed, start, stop = reports[0]
    assert stop is None and start == max(0, end - WINDOW - PAD), reports
    assert fed >= end and fed - end < max(chunks), "reported in the chunk that completed its window"
    one_state = WINDOW * math.ceil((onset + WINDOW // 2) / WINDOW)    # what a single state's windows would give
    assert end <= one_state and (end < one_state) == (one_state - (onset + WINDOW // 2) >= HOP)


def test_speech_stops_after_the_silence_in_hops():
    signal = voiced(60_000, 4000, 20_000)
    reports, _ = run(signal, [320] * 200)
    last_speech = (20_000 + WINDOW // 2) // HOP * HOP     # the last window with >= 256 voiced samples
    stops = [r for r in reports if r[2] is not None]
    assert len(stops) == 1 and stops[0][2] == last_speech + HOP * math.ceil(SILENCE / HOP), reports


def test_each_state_reads_its_windows_one_after_the_other():
    ramp = np.arange(10_000, dtype=np.float32)            # each sample its index: a window's first sample is its start
    _, vad = run(ramp, [333] * 31)
    first, second = (m.firsts for m in vad.models)
    assert first == [512.0 * k for k in range(len(first))] and len(first) == (10_000 - WINDOW) // WINDOW + 1
    assert second == [256.0 + 512 * k for k in range(len(second))]
    assert len(second) == (10_000 - 256 - WINDOW) // WINDOW + 1
