"""The contract a model fulfils to be served: what the engine asks of the model file's host.

The engine is generic: it schedules rows through the walks of the model's declared pipeline
(graphc/stages.py) and knows no model. What only the model file knows comes from its
`host(model, checkpoint)`, a `Host`:

  prompt(ids, media) -> Prompt   expand each media placeholder token of `ids` into the rows the encoder's
                                 output fills, compute the LLM's positions (M-RoPE or 1-D), and cut each
                                 media item into pieces an encoder step may run alone (an 8 s audio window,
                                 one image, one video frame group)
  encode(node, pieces, units)    the encoder node's inputs for those pieces packed into one step of
                                 `units` (windows, patches), its attention segments, and where each
                                 piece's output rows start
  speech                         a `Speech` when the pipeline has a follow and a chunk stage (speech out)
  transcription                  a `Transcription` when the model transcribes in its own way
  use_tokenizer(tokenizer)       the engine's tokenizer, for a host that writes text into prompts

The engine feeds the LLM node by port convention: token_ids [T], positions [P, T] or [T], sample_rows [S];
an encoder's outputs reach the LLM through the declaration's edges, and the int64 [tokens] port of the
same optional group receives, for each token row, the encoder output row that replaces its embedding
(-1: keep the token's).

Models import this module's names from `graphc` (graphc/__init__.py), never the runtime's modules.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import torch
from pydantic import Field

from graphc.errors import InvalidInput
from graphc.strict import Strict

MediaKind = Literal["audio", "image", "video"]


@dataclass
class Media:
    """One media input as the user gave it, decoded: audio float32 [n] at 16 kHz, an image uint8
    [3, H, W], a video uint8 [F, 3, H, W] sampled at `fps` frames a second, or, where `times` is given, its
    frames at those times (seconds into the clip: a host's SpreadFrames sampling)."""

    kind: MediaKind
    data: np.ndarray | torch.Tensor
    fps: float | None = None
    audio: np.ndarray | None = None     # a video's own sound at 16 kHz, heard with it (use_audio_in_video)
    times: tuple[float, ...] | None = None


@dataclass(frozen=True)
class SpreadFrames:
    """A video sampled as evenly spaced frames over the whole clip, where a host sets Host.video_frames to one
    (None: the frames nearest k / fps). Of a clip of `total` frames at `rate` a second, asked for `fps`:
    n = int(total / rate x fps), within [min_frames, max_frames] and at most total; frame k of n is index
    k x (total - 1) / (n - 1) in decode order, rounded half to even (distinct: n is at most total). A kept
    frame's time is its index / rate. fps: the rate a request that names none is sampled at (None: the runtime's default, 2)."""

    min_frames: int = 4
    max_frames: int = 768
    fps: float | None = None

    def __post_init__(self):
        if not all(type(n) is int for n in (self.min_frames, self.max_frames)) or \
                not 1 <= self.min_frames <= self.max_frames:
            raise InvalidInput(f"SpreadFrames({self.min_frames}, {self.max_frames})",
                               "frames are at least 1 and min_frames at most max_frames", "e.g. SpreadFrames(4, 768)")
        if self.fps is not None and (isinstance(self.fps, bool) or not isinstance(self.fps, (int, float))
                                     or not 0 < self.fps <= 60):
            raise InvalidInput(f"SpreadFrames fps {self.fps!r}", "a rate is over 0 and at most 60 frames a second",
                               "e.g. fps=2")

    def indices(self, total: int, rate: float, fps: float) -> list[int]:
        """The frame indices kept of a clip of `total` frames at `rate` frames a second, sampled at `fps`."""
        n = min(max(int(total / rate * fps), self.min_frames), self.max_frames, total)
        return np.linspace(0, total - 1, n).round().astype(int).tolist() if n > 0 else []


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


class Host(ABC):
    """Base of a model file's host. Subclasses set `eos_token_ids` and implement prompt() and encode(); a
    model that speaks sets `speech`, one that transcribes in its own way `transcription`."""

    eos_token_ids: tuple[int, ...] = ()
    speech: "Speech | None" = None
    transcription: "Transcription | None" = None
    # xgrammar's structural-tag style of the `<function=N><parameter=P>VALUE</parameter>` tool-call arguments the
    # model's chat templates write; None: tool_choice required or named is refused where a template writes them
    tool_xml_style: str | None = None

    # how the runtime samples a video file's frames for this host (None: the frames nearest k / fps)
    video_frames: SpreadFrames | None = None

    @abstractmethod
    def prompt(self, ids: list[int], media: list[Media]) -> Prompt:
        """The request's prompt rows: placeholders of `ids` expanded for `media` (in order), positions, and
        each media item cut into pieces on the encoder stage's walk. Refuses (InvalidInput) what it cannot
        serve."""

    @abstractmethod
    def encode(self, node: str, pieces: list[Piece], units: int) -> EncodeBatch:
        """Encoder `node`'s step inputs for `pieces`, padded to `units` on its capture axis."""

    def media_limits(self, max_rows: int) -> tuple[float | None, int | None]:
        """(seconds of audio, frames of video) beyond which an item surely takes more than max_rows prompt
        rows: longer ones are refused before they are decoded. None: no bound known."""
        return None, None

    def use_tokenizer(self, tokenizer: Any) -> None:
        """The engine's tokenizer (a `tokenizers.Tokenizer`: graphc run --tokenizer DIR's, else the checkpoint's),
        given once after the host is made, before any prompt, when the engine has one: a host that writes text
        into prompts, or reads a special token's id, takes it from here. Default: unused."""


class SpeechSampling(Strict):
    """How the follow stage picks a frame's first code (temperature 0: greedy, and the other codes greedy
    too; top_k 0: every id; repetition_penalty over the request's earlier first codes). A model's Speech
    says its defaults."""

    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, allow_inf_nan=False)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class FollowPrompt:
    """A request's prompt for the follow stage: rows, positions [P, rows], the delta decode rows continue
    at, and its per-row prompt inputs by port. empty: the request has nothing to say."""

    rows: int
    positions: torch.Tensor
    delta: int
    inputs: dict[str, torch.Tensor]
    empty: bool = False

    @classmethod
    def silent(cls, position_rows: int) -> "FollowPrompt":
        """The prompt of a request with nothing to say; position_rows: P of the follow node's positions."""
        return cls(0, torch.zeros(position_rows, 0, dtype=torch.int64), 0, {}, empty=True)

    def positions_of(self, start: int, end: int) -> torch.Tensor:
        if end <= self.rows:
            return self.positions[:, start:end]
        return torch.arange(start + self.delta, end + self.delta).expand(self.positions.shape[0], -1)


class Slot(Protocol):
    """Where a chunk of frames sits in a chunk stage's slot: `frames` the slot length it needs, and the
    samples [keep_start, keep_stop) of the slot's audio that are new."""

    frames: int
    keep_start: int
    keep_stop: int


class Speech(ABC):
    """What a pipeline's follow stage (codes, a frame a step, from the LLM's rows) and chunk stage (codes
    to audio, a chunk a step) need of the model's host. The stages' nodes and walks are the pipeline's.

    Attributes: voices (name -> the model's speaker id), default_voice, sampling (the default
    SpeechSampling), first_chunk (frames of a request's first audio chunk by default), noise_shape (a
    frame's random draws, the `noise` row), seen_size (the `seen` row's width), trailing_pad (the token a
    padding row speaks)."""

    voices: dict[str, int] = {}
    default_voice: str = ""
    sampling: SpeechSampling = SpeechSampling()
    first_chunk: int = 1
    noise_shape: tuple[int, ...] = ()
    seen_size: int = 0
    trailing_pad: int = 0

    @abstractmethod
    def bind(self, modules: dict, device: torch.device) -> None:
        """The booted modules by node name and their device, before the first step."""

    @abstractmethod
    def check(self, prompt: Prompt) -> None:
        """Refuse (InvalidInput) a prompt that cannot be spoken."""

    @abstractmethod
    def hidden_rows(self, prompt: Prompt) -> list[int]:
        """The prompt rows whose LLM outputs (the follow stage's `reads` ports) its prompt reads."""

    @abstractmethod
    def follow_prompt(self, prompt: Prompt, output: list[int], text_done: bool, voice: str,
                      hidden: dict[int, torch.Tensor]) -> FollowPrompt | None:
        """The follow stage's prompt, or None until the text it needs exists (`output`: the LLM's tokens so
        far, whose last may be a placeholder, a negative id of a token still on the device: it says that the id
        before it is not the last, never which token it is, so read only the ids before it; `hidden`: the read
        rows by row)."""

    @abstractmethod
    def trailing(self, prompt: Prompt, output: list[int], text_done: bool, frame: int) -> int | None:
        """The token whose embedding frame `frame` adds to the follow stage's next row, None until known
        (`output` as in follow_prompt; a placeholder returned here makes the frame wait for its read)."""

    @abstractmethod
    def embed(self, ids: list[int]) -> torch.Tensor:
        """The LLM's embeddings of `ids`, [n, H] on the device."""

    @abstractmethod
    def sampling_row(self, sampling: SpeechSampling) -> list[float]:
        """The follow node's `sampling` input row for these parameters."""

    @abstractmethod
    def seen_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [n, G] -> [n, k]: the ids a frame adds to the request's `seen` row."""

    @abstractmethod
    def follow_inputs(self, parts: list, samples: list[int], trailing: list[torch.Tensor], prefill: bool,
                      sampling: torch.Tensor, noise: torch.Tensor, seen: torch.Tensor) -> dict:
        """One follow step's inputs by port. parts: ("prompt", FollowPrompt, start, end) or ("decode",
        next_embed [H], position); samples: the rows that emit a frame; trailing: each one's text
        embedding; sampling, noise, seen: each sample row's."""

    @abstractmethod
    def follow_layouts(self, samples: int) -> dict:
        """Ragged layouts (role -> cu_seqlens) of a follow step of `samples` sample rows."""

    @abstractmethod
    def is_end(self, codes: list[int]) -> bool:
        """The frame ends the speech."""

    @abstractmethod
    def chunk_frames(self, index: int, first: int) -> int:
        """New frames of a request's index-th audio chunk (`first`: the frames of its first)."""

    @abstractmethod
    def slot(self, start: int, end: int) -> Slot:
        """The slot that decodes frames [start, end) with the context before them."""

    @abstractmethod
    def chunk_inputs(self, filled: list[tuple[torch.Tensor, Slot]], slots: int, slot_frames: int) -> tuple[dict, dict]:
        """(inputs, layouts) of a chunk step of `slots` slots of `slot_frames` frames: filled holds each
        used slot's codes [G, frames] and Slot, slot after slot."""


class Transcription(Protocol):
    """How a model is asked to transcribe one audio item, and how its answer is read."""

    def prompt(self, template: Any, context: str, language: str | None) -> str:
        """The text prompt (rendered by the chat `template`) for one audio item; `context` the user's prompt."""

    def reader(self, language: str | None) -> Any:
        """An object with add(text, last=False) -> the text to stream now, .text (the transcript so far)
        and .language (what the model reported or was told, or '')."""


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
