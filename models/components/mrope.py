"""Interleaved M-RoPE (Qwen3-Omni's thinker and talker) and the host-side 3-D positions it reads.

A rotary embedding has head_dim/2 frequency slots. M-RoPE gives each slot one of three position rows
(T, H, W). With mrope_section [24, 20, 20] (the real model) slots 1, 4, ..., 58 read H, slots 2, 5, ..., 59
read W and every other slot (0, 3, ..., 57 and 60..63) reads T: HF's interleaved layout. The sections
must sum to head_dim/2. For text the three rows are equal and this is ordinary 1-D RoPE.

Positions are computed on the host (`rope_index`, a port of HF's get_rope_index for one sequence) and fed
to the node as positions [3, T] int64; forward only gathers and multiplies.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch
from pydantic import Field

from graphc import Strict
from models.components.thinker_config import check_mrope_section


def mrope_slots(head_dim: int, mrope_section: Sequence[int]) -> torch.Tensor:
    """The position row (0 T, 1 H, 2 W) each of the head_dim/2 frequency slots reads: [head_dim/2] int64."""
    check_mrope_section(head_dim, mrope_section)
    slots = torch.zeros(head_dim // 2, dtype=torch.int64)
    for axis in (1, 2):
        slots[axis:3 * mrope_section[axis]:3] = axis
    return slots


def mrope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [3, T] -> cos, sin [T, 1, D] in the half-split layout, each slot at its own axis' position."""
    per_slot = positions.index_select(0, slots).t().float()                # [T, D/2]
    freqs = per_slot * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)                                # [T, D]
    return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def text_positions(start: int, length: int) -> torch.Tensor:
    """1-D positions start..start+length-1 on all three rows: [3, length] int64 (text, decode steps)."""
    return torch.arange(start, start + length, dtype=torch.int64).expand(3, -1).contiguous()


class MediaTokens(Strict):
    """The ids and rates rope_index reads; defaults are the real Qwen3-Omni-30B-A3B values."""

    audio_token_id: int = 151675
    image_token_id: int = 151655
    video_token_id: int = 151656
    audio_start_token_id: int = 151669
    vision_start_token_id: int = 151652
    position_id_per_seconds: int = Field(13, ge=1)
    spatial_merge_size: int = Field(2, ge=1)


def _vision(grid_thw: Sequence[int], seconds_per_grid: float, media: MediaTokens, start: int) -> torch.Tensor:
    """[3, t*h*w/merge^2]: T = frame group x seconds x rate, H/W = merged grid row/col, all offset by start."""
    t, h, w = (int(x) for x in grid_thw)
    h, w = h // media.spatial_merge_size, w // media.spatial_merge_size
    f64 = torch.float64
    tt = torch.arange(t, dtype=f64) * seconds_per_grid * media.position_id_per_seconds
    rows = torch.stack([tt.view(-1, 1, 1).expand(t, h, w), torch.arange(h, dtype=f64).view(1, -1, 1).expand(t, h, w),
                        torch.arange(w, dtype=f64).view(1, 1, -1).expand(t, h, w)])
    return rows.reshape(3, -1) + start


def _interleave(video: torch.Tensor, audio: torch.Tensor) -> list[torch.Tensor]:
    """Audio-in-video: merge video and audio columns by temporal position, video first on ties (HF's order)."""
    out, vi, ai = [], 0, 0
    while vi < video.shape[1] and ai < audio.shape[1]:
        if video[0, vi] <= audio[0, ai]:
            out.append(video[:, vi:vi + 1])
            vi += 1
        else:
            out.append(audio[:, ai:ai + 1])
            ai += 1
    return out + [r for r in (video[:, vi:], audio[:, ai:]) if r.shape[1]]


def _span(start: float, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float64).expand(3, -1) + start


def _place(kind: str, start: float, media: MediaTokens, audio: deque, images: deque, videos: deque
           ) -> list[torch.Tensor]:
    """The position chunks of one media item (inside its start/end tokens), taking its sizes off the queues."""
    if kind == "audio":
        return [_span(start, audio.popleft())]
    if kind == "image":
        return [_vision(images.popleft(), 1.0, media, start)]
    grid, seconds = videos.popleft()
    video = _vision(grid, seconds, media, start)
    return [video] if kind == "video" else _interleave(video, _span(start, audio.popleft()))


QWEN3_OMNI_MEDIA = MediaTokens()


def rope_index(input_ids: Sequence[int], media: MediaTokens = QWEN3_OMNI_MEDIA, *,
               audio_lengths: Sequence[int] = (), image_grid_thw: Sequence[Sequence[int]] = (),
               video_grid_thw: Sequence[Sequence[int]] = (), video_second_per_grid: Sequence[float] = ()
               ) -> tuple[torch.Tensor, int]:
    """3-D positions of one prompt: (positions [3, L] int64, delta) with delta = max position + 1 - L.

    A later token at index i >= L (decode) sits at position i + delta on all three rows. Covered, as in HF's
    get_rope_index: text, audio runs (<audio_start> N x audio <audio_end>; audio_lengths[i] = N, the audio
    encoder's output rows), images and videos (<vision_start> tokens <vision_end>, grids in patches before
    merging), and audio inside video (HF's use_audio_in_video, recognised by <vision_start><audio_start>:
    interleaved tokens, then <audio_end><vision_end>). Media items are consumed in order of appearance. HF's quirk is kept: the start
    after an item is the max of the last chunk placed, plus one. Video times that are not whole positions
    (seconds_per_grid x rate fractional) are refused: the node takes int64 positions.
    """
    ids = list(input_ids)
    audio, images = deque(audio_lengths), deque(image_grid_thw)
    videos = deque(zip(video_grid_thw, video_second_per_grid, strict=True))
    chunks: list[torch.Tensor] = []
    st = 0

    def next_start() -> float:
        return float(chunks[-1].max()) + 1 if chunks else 0.0

    def find(token: int, left: bool) -> int:
        return ids.index(token, st) if left and token in ids[st:] else len(ids) + 1

    while True:
        vis = find(media.vision_start_token_id, bool(images or videos))
        aud = find(media.audio_start_token_id, bool(audio))
        at = min(vis, aud)
        if at > len(ids):
            break
        if at > st:
            chunks.append(_span(next_start(), at - st))
        bos = 2 if at == vis and vis + 1 == aud else 1                   # audio in video opens with two tokens
        chunks.append(_span(next_start(), bos))
        kind = "audio" if at == aud else "audio_in_video" if bos == 2 else \
            "image" if ids[at + 1] == media.image_token_id else "video"
        item = _place(kind, next_start(), media, audio, images, videos)
        chunks += item
        chunks.append(_span(next_start(), bos))
        st = at + 2 * bos + sum(c.shape[1] for c in item)
    if st < len(ids):
        chunks.append(_span(next_start(), len(ids) - st))
    pos = torch.cat(chunks, dim=1) if chunks else torch.zeros(3, 0, dtype=torch.float64)
    if pos.shape[1] != len(ids):
        raise ValueError(f"media items cover {pos.shape[1]} positions but the prompt has {len(ids)} tokens; "
                         "check audio_lengths and the grids against the placeholder runs")
    if not torch.equal(pos, pos.round()):
        raise ValueError("video temporal positions are fractional (seconds_per_grid x position_id_per_seconds); "
                         "int64 positions cannot hold them")
    delta = int(pos.max()) + 1 - len(ids) if len(ids) else 0
    return pos.to(torch.int64), delta


def typed_rope_index(types: Sequence[int], grids: Sequence[Sequence[int]], merge: int) -> tuple[torch.Tensor, int]:
    """HF Qwen3.5's get_rope_index for one prompt: (positions [3, L] int64, delta = max position + 1 - L).

    types: each token's kind, 0 text, 1 image, 2 video (HF's mm_token_type_ids); a run of one kind is a group.
    A text group runs on from the current position on all three rows. A media group takes the next grid
    (t, h, w) in patches (a video's frames are one grid (1, h, w) each, timestamp text between them): its
    tokens sit at current + (t index, merged row, merged column), and the current position moves on by
    max(h, w) / merge."""
    grids = deque(grids)
    chunks, cur, i = [], 0, 0
    while i < len(types):
        j = i
        while j < len(types) and types[j] == types[i]:
            j += 1
        if types[i] == 0:
            chunks.append(torch.arange(cur, cur + j - i, dtype=torch.int64).expand(3, -1))
            cur += j - i
        else:
            if not grids:
                raise ValueError(f"a media run at token {i} has no grid left")
            t, h, w = (int(x) for x in grids.popleft())
            h, w = h // merge, w // merge
            if t * h * w != j - i:
                raise ValueError(f"the media run at token {i} has {j - i} tokens; its grid ({t}, {h}, {w}) merged "
                                 f"gives {t * h * w}")
            g = torch.meshgrid(torch.arange(t), torch.arange(h) + cur, torch.arange(w) + cur, indexing="ij")
            pos = torch.stack(g).reshape(3, -1)
            pos[0] += cur
            chunks.append(pos)
            cur += max(h, w)
        i = j
    if grids:
        raise ValueError(f"{len(grids)} grid(s) left over: the prompt has fewer media runs than grids")
    pos = torch.cat(chunks, dim=1) if chunks else torch.zeros(3, 0, dtype=torch.int64)
    return pos, (int(pos.max()) + 1 - len(types)) if len(types) else 0
