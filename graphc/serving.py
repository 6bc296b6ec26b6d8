"""The model host interface: what serving a model needs on the host that only the model file knows.

The engine is generic: it schedules rows of token ids through the plan's walks. What is model-specific
comes from the model file's `host(model, config)` as a `Host`:

  prompt(ids, media) -> Prompt   expand each media placeholder token of `ids` into the rows the encoder's
                                 output fills, compute the LLM's positions (M-RoPE or 1-D), and cut each
                                 media item into pieces an encoder step may run alone (an 8 s audio window,
                                 one image, one video frame group)
  encode(node, pieces, units)    the encoder node's inputs for those pieces packed into one step of
                                 `units` (windows, patches), its attention segments, and where each
                                 piece's output rows start

The engine feeds the LLM node (the node of the walk that holds a paged KV role) by port convention:
token_ids [T], positions [P, T] or [T], sample_rows [S]; an encoder's outputs reach the LLM through the
declaration's edges, and the int64 [tokens] port of the same optional group receives, for each token
row, the encoder output row that replaces its embedding (-1: keep the token's).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from graphc.errors import InvalidInput

MediaKind = Literal["audio", "image", "video"]


@dataclass
class Media:
    """One media input as the user gave it, decoded: audio float32 [n] at 16 kHz, an image uint8
    [3, H, W], a video uint8 [F, 3, H, W] sampled at `fps` frames a second."""

    kind: MediaKind
    data: np.ndarray | torch.Tensor
    fps: float | None = None
    audio: np.ndarray | None = None     # a video's own sound at 16 kHz, heard with it (use_audio_in_video)


@dataclass
class Piece:
    """A part of a media item an encoder step can run on its own.

    units: on the encoder's capture axis (windows, patches); segments: attention segments it adds;
    rows: the prompt rows its output rows fill, in output order; data: the host's own."""

    units: int
    segments: int
    rows: list[int]
    data: Any = None
    node: str = ""                      # the encoder that runs it (set by the host)

    @property
    def first(self) -> int:
        return min(self.rows)

    @property
    def last(self) -> int:
        return max(self.rows)


@dataclass
class MediaItem:
    walk: str          # the prefill walk that encodes it
    node: str          # the encoder node on that walk
    kind: MediaKind
    pieces: list[Piece]


@dataclass
class Prompt:
    """A request's prompt rows: ids with placeholders expanded, their positions, the media pieces."""

    ids: list[int]
    positions: torch.Tensor             # [P, L] int64
    delta: int                          # a row i >= L sits at position i + delta (on every one of the P rows)
    media: list[MediaItem] = field(default_factory=list)
    rope: dict = field(default_factory=dict)   # what the host's position rule read besides ids (M-RoPE grids)
    host_data: dict = field(default_factory=dict)   # the host's own facts about this prompt, kept with it

    def positions_of(self, start: int, end: int) -> torch.Tensor:
        """[P, end - start] int64 positions of rows [start, end), prompt rows and generated rows alike."""
        n = len(self.ids)
        parts = []
        if start < n:
            parts.append(self.positions[:, start:min(end, n)])
        if end > n:
            lo = max(start, n)
            parts.append(torch.arange(lo + self.delta, end + self.delta, dtype=torch.int64)
                         .expand(self.positions.shape[0], -1))
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def walks(self) -> set[str]:
        return {m.walk for m in self.media}


@dataclass
class EncodeBatch:
    """One encoder step: its inputs by port, each attention role's cu_seqlens, and each piece's first
    output row."""

    inputs: dict[str, torch.Tensor]
    segments: dict[str, list[int]]
    offsets: list[int]


class Host:
    """Base of a model file's host. Subclasses set `eos_token_ids` and implement prompt() and encode().
    A model that speaks sets `speech` (graphc/runtime/speech.py's SpeechHost)."""

    eos_token_ids: tuple[int, ...] = ()
    speech: Any = None

    def prompt(self, ids: list[int], media: list[Media]) -> Prompt:
        raise NotImplementedError

    def encode(self, node: str, pieces: list[Piece], units: int) -> EncodeBatch:
        raise NotImplementedError

    def media_limits(self, max_rows: int) -> tuple[float | None, int | None]:
        """(seconds of audio, frames of video) beyond which an item surely takes more than max_rows prompt
        rows: longer ones are refused before they are decoded. None: no bound known."""
        return None, None


def expand_placeholders(ids: list[int], media: list[Media], token_of: dict[str, int],
                        replacements: list[list[int]]) -> tuple[list[int], list[int]]:
    """ids with the i-th media placeholder token replaced by replacements[i], and where each replacement
    starts.

    Placeholders are matched in order (the i-th placeholder of any kind is media[i]'s, and must be of
    its kind); a count that differs from len(media) is refused."""
    marks = {v: k for k, v in token_of.items()}
    found = [(i, marks[t]) for i, t in enumerate(ids) if t in marks]
    if len(found) != len(media):
        kinds = ", ".join(f"{k} ({token_of[k]})" for k in token_of)
        raise InvalidInput(f"the prompt has {len(found)} media placeholder token(s) and the request {len(media)} "
                           f"media item(s)", f"each media item is marked by one placeholder token: {kinds}",
                           "put one placeholder where each item goes (the chat template does this for you)")
    out, starts, prev = [], [], 0
    for (at, kind), item, rep in zip(found, media, replacements):
        if kind != item.kind:
            raise InvalidInput(f"media item {len(starts)} is {item.kind} but its placeholder is {kind}'s",
                               "placeholders and items are matched in order", "reorder the media or the prompt")
        out += ids[prev:at]
        starts.append(len(out))
        out += rep
        prev = at + 1
    return out + ids[prev:], starts
