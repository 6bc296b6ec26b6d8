"""A session's input audio buffer: 16 kHz samples as they arrived, indexed from the session's first sample,
kept as chunks (a long turn of 20 ms appends is not copied on every append)."""
from __future__ import annotations

import numpy as np


class InputBuffer:
    def __init__(self):
        self.chunks: list[np.ndarray] = []
        self.base = 0          # the session's sample index of the first sample held
        self.total = 0         # samples held

    @property
    def end(self) -> int:
        """The session's sample index just past the last sample held."""
        return self.base + self.total

    def append(self, samples: np.ndarray) -> None:
        if len(samples):
            self.chunks.append(samples)
            self.total += len(samples)

    def _whole(self) -> np.ndarray:
        if len(self.chunks) != 1:
            self.chunks = [np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)]
        return self.chunks[0]

    def take(self, start: int, stop: int) -> np.ndarray:
        """Samples [start, stop) of the session (clipped to what is held); everything before stop is dropped."""
        whole = self._whole()
        a, b = max(start - self.base, 0), max(min(stop - self.base, self.total), 0)
        out = whole[a:b].copy()
        self.drop_to(stop)
        return out

    def drop_to(self, index: int) -> None:
        """Forget the samples before the session's sample `index`."""
        n = min(max(index - self.base, 0), self.total)
        if n:
            whole = self._whole()
            self.chunks = [whole[n:]]
            self.base += n
            self.total -= n

    def keep_last(self, samples: int, slack: int) -> None:
        """Hold only the last `samples` once more than samples + slack are held (VAD between turns)."""
        if self.total > samples + slack:
            self.drop_to(self.end - samples)

    def clear(self) -> None:
        self.drop_to(self.end)
