"""The host of Qwen3.5 (Qwen3-VL's prompt layout): images as AudioVisualHost's; a video as Qwen3-VL's processor
lays it out, each temporal patch (two frames) a block of its own after its time as text:

    <|vision_start|> <t0 seconds> <|vision_start|> video x n <|vision_end|> <t1 seconds> ... <|vision_end|>

(the outer start and end are the chat template's, around the placeholder). t_k is the mean time of the block's
first and last frame, printed with one decimal ("<0.5 seconds>"), and its ids are the engine tokenizer's (Host.use_tokenizer).
The clip is resized by one pixel budget over all its frames (vision_inputs.process_clip). Positions follow HF
Qwen3.5's get_rope_index (mrope.typed_rope_index): every block is a grid of one frame group, and text runs on
between them. Frames arrive sampled as the processor samples them (evenly spaced over the clip: the host's
video_frames, a SpreadFrames the runtime's loader follows), with their times (Media.times), or at a rate (Media.fps).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from graphc import InvalidInput, Media, MediaItem, Prompt, SpreadFrames, expand_placeholders
from models.components.hosting import AudioVisualHost
from models.components.mrope import typed_rope_index
from models.components.vision_inputs import VisionItem, process_clip

KIND_TYPE = {"image": 1, "video": 2}      # HF's mm_token_type_ids: text 0, image 1, video 2


def block_times(item: Media, temporal: int) -> list[float]:
    """Each temporal block's time in seconds: the mean of its first and last frame's (Media.times, else frame i
    at i / fps), the last block's frames padded by repeating the last one (HF Qwen3VLProcessor._calculate_timestamps)."""
    t = list(item.times) if item.times is not None else [i / item.fps for i in range(len(item.data))]
    t += [t[-1]] * (-len(t) % temporal)
    return [(t[i] + t[i + temporal - 1]) / 2 for i in range(0, len(t), temporal)]


class TimestampVideoHost(AudioVisualHost):
    def __init__(self, *args, vision_end: int, timestamp_ids: Callable[[str], list[int]] | None,
                 video_frames: SpreadFrames = SpreadFrames(), **kwargs):
        """vision_end: <|vision_end|>'s id; timestamp_ids: text -> its token ids (the checkpoint's tokenizer,
        until the engine gives its own through use_tokenizer; None: no tokenizer, and videos are refused);
        video_frames: how a video file's frames are sampled (HF Qwen3VLVideoProcessor's min_frames,
        max_frames and fps: 4, 768 and 2 by default)."""
        super().__init__(*args, **kwargs)
        self.vision_end, self.timestamp_ids = vision_end, timestamp_ids
        self.video_frames = video_frames

    def use_tokenizer(self, tokenizer) -> None:
        """The engine's tokenizer (graphc run --tokenizer DIR, else the checkpoint's) writes the frame groups'
        times, in place of the one the model file's host() read from the checkpoint."""
        super().use_tokenizer(tokenizer)
        self.timestamp_ids = lambda text: tokenizer.encode(text, add_special_tokens=False).ids

    def media_limits(self, max_rows: int) -> tuple[float | None, int | None]:
        """A clip's frame group takes at least 3 rows (one merged patch: the budget never shrinks a side below
        a patch x merge, and its start and end tokens; its time's text besides), so frames beyond
        temporal x (max_rows / 3 + 1) surely overflow."""
        return None, (self.vision.temporal_patch_size * (max_rows // 3 + 1) if self.encoders.video else None)

    def _prepare(self, item: Media):
        if item.kind != "video" or self.encoders.video is None:
            return super()._prepare(item)                 # images; or a video refused there, with the kinds it takes
        if item.times is None and (not item.fps or item.fps <= 0):
            raise InvalidInput("a video needs its sampling rate", f"fps is {item.fps}", "pass the frames' fps")
        if item.times is not None and len(item.times) != len(item.data):
            raise InvalidInput("a video's frame times must be one a frame", f"{len(item.times)} times for "
                               f"{len(item.data)} frames", "give Media.times a time for each frame, or leave it None")
        if item.audio is not None:
            raise InvalidInput("this model cannot hear a video's sound (use_audio_in_video)",
                               "it takes images and videos, no audio", "leave use_audio_in_video off")
        if self.timestamp_ids is None:
            raise InvalidInput("a video prompt needs a tokenizer", "each of its frame groups is "
                               "preceded by its time as text (<0.5 seconds>), in the tokenizer's ids",
                               "serve a checkpoint that has tokenizer.json or pass --tokenizer DIR, or send images")
        vi = self.node_dtype(process_clip(torch.as_tensor(item.data), self.vision))
        return vi, vi.num_patches // self.vcfg.merge_unit

    def _video_ids(self, vi: VisionItem, item: Media) -> list[int]:
        t, h, w = vi.grid_thw
        per = h * w // self.vcfg.merge_unit
        out = []
        for s in block_times(item, self.vision.temporal_patch_size):
            out += self.timestamp_ids(f"<{s:.1f} seconds>")
            out += [self.media.vision_start_token_id] + [self.media.video_token_id] * per + [self.vision_end]
        return out

    def prompt(self, ids: list[int], media: list[Media]) -> Prompt:
        prepared = [self._prepare(m) for m in media]
        reps = [self._video_ids(vi, m) if m.kind == "video" else [self.token_of[m.kind]] * n
                for m, (vi, n) in zip(media, prepared)]
        expanded, starts = expand_placeholders(ids, media, self.token_of, reps)
        type_of = {self.media.image_token_id: KIND_TYPE["image"], self.media.video_token_id: KIND_TYPE["video"]}
        types = [type_of.get(t, 0) for t in expanded]
        grids = []
        for m, (vi, _) in zip(media, prepared):
            t, h, w = vi.grid_thw
            grids += [(1, h, w)] * t if m.kind == "video" else [vi.grid_thw]
        positions, delta = typed_rope_index(types, grids, self.vision.merge_size)
        items = []
        for m, (vi, _), start, rep in zip(media, prepared, starts, reps):
            node, walk = getattr(self.encoders, m.kind)
            rows = [start + i for i, t in enumerate(rep) if t == self.token_of[m.kind]]
            items.append(MediaItem(walk=walk, node=node, kind=m.kind, pieces=self._pieces(m.kind, vi, rows, node)))
        return Prompt(ids=expanded, positions=positions, delta=delta, media=items)


def spread_frames(checkpoint: str | None) -> SpreadFrames:
    """How the checkpoint's video processor samples a clip: min_frames, max_frames and fps from its
    video_preprocessor_config.json, HF Qwen3VLVideoProcessor's 4, 768 and 2 where absent."""
    import json
    from pathlib import Path

    path = Path(checkpoint) / "video_preprocessor_config.json" if checkpoint else None
    d = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    got = {k: d[k] for k in ("min_frames", "max_frames", "fps") if d.get(k) is not None}
    return SpreadFrames(**got)
