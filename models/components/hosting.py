"""The host side of Qwen3-Omni's thinker and Qwen3-ASR (graphc's Host contract, graphc/serving.py).

Audio: 16 kHz waveform -> Whisper log-mel -> cut at multiples of n_window_infer mel frames (8 s), each
piece one window an AuT step runs alone (models/components/aut.py: windows are independent).
Images: one piece each. Videos: one piece per temporal patch slice (attention segments, position
embeddings and merges never cross a slice). Positions: M-RoPE (mrope.rope_index) when the LLM takes
positions [3, T], else 1-D.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphc import EncodeBatch, Host, InvalidInput, Media, MediaItem, Model, Piece, Prompt, expand_placeholders
from models.components.audio_inputs import HOP_LENGTH, SAMPLE_RATE, log_mel, num_tokens, pack_audios
from models.components.aut import AuTConfig
from models.components.mrope import MediaTokens, rope_index
from models.components.vision import VisionConfig
from models.components.vision_inputs import VisionItem, VisionProcessing, build_step, process_image, process_video


@dataclass(frozen=True)
class Encoders:
    """Which node and walk encode each media kind (None: the model takes no such media)."""

    audio: tuple[str, str] | None = None          # (node, walk)
    image: tuple[str, str] | None = None
    video: tuple[str, str] | None = None
    audio_in_video: str | None = None             # the walk that runs the audio and the vision encoder together


def random_media_tokens(vocab: int) -> MediaTokens:
    """Media token ids for seeded weights on a vocabulary too small for the real ids: the last ones."""
    return MediaTokens(audio_token_id=vocab - 1, image_token_id=vocab - 2, video_token_id=vocab - 3,
                       audio_start_token_id=vocab - 4, vision_start_token_id=vocab - 5)


class AudioVisualHost(Host):
    tool_xml_style = "qwen_xml"       # xgrammar's name for the <function=N><parameter=P> form Qwen's templates write
    def __init__(self, model: Model, llm: str, encoders: Encoders, media: MediaTokens, mrope: bool,
                 eos_token_ids: tuple[int, ...], vision: VisionProcessing | None = None, audio_end: int | None = None):
        """audio_end: the <|audio_end|> id, which closes an audio-in-video run (HF's audio_eos_token)."""
        self.model, self.llm, self.encoders, self.media, self.mrope = model, llm, encoders, media, mrope
        self.audio_end = audio_end
        self.eos_token_ids = tuple(eos_token_ids)
        self.vision = vision or VisionProcessing()
        self.token_of = {}
        if encoders.audio:
            self.aut: AuTConfig = model.node(encoders.audio[0]).config
            self.token_of["audio"] = media.audio_token_id
        if encoders.image or encoders.video:
            node = (encoders.image or encoders.video)[0]
            self.vcfg: VisionConfig = model.node(node).config
            self.vision = self.vision.model_copy(update=dict(patch_size=self.vcfg.patch_size,
                                                             temporal_patch_size=self.vcfg.temporal_patch_size,
                                                             merge_size=self.vcfg.spatial_merge_size))
            self.patch_dtype = getattr(torch, model.node(node).inputs["pixel_patches"].dtype)
        if encoders.image:
            self.token_of["image"] = media.image_token_id
        if encoders.video:
            self.token_of["video"] = media.video_token_id

    def media_limits(self, max_rows: int) -> tuple[float | None, int | None]:
        """Audio: one chunk more than max_rows' worth of full chunks (each chunk_frames mel frames, 100 a
        second, gives chunk_tokens rows). Video: a temporal patch gives at least video_min_pixels / factor^2
        rows (smart_resize keeps the area at least that); half of it is counted, to stay on the safe side."""
        seconds = frames = None
        if self.encoders.audio:
            seconds = (max_rows // self.aut.chunk_tokens + 1) * self.aut.chunk_frames * HOP_LENGTH / SAMPLE_RATE
        if self.encoders.video:
            least = max(self.vision.video_min_pixels // self.vision.factor ** 2 // 2, 1)
            frames = self.vision.temporal_patch_size * (max_rows // least + 1)
        return seconds, frames

    def use_tokenizer(self, tokenizer) -> None:
        """The engine's tokenizer: <|audio_end|>'s id, where it has one, closes an audio-in-video run (the
        tokenizer the chat template's text is encoded with is the one source of that id)."""
        found = tokenizer.token_to_id("<|audio_end|>")
        if found is not None and self.audio_end is not None:
            self.audio_end = found

    # ---- prompt rows
    def _mel(self, wave) -> tuple[torch.Tensor, int]:
        wave = torch.as_tensor(wave, dtype=torch.float32)
        if wave.ndim != 1 or wave.numel() <= 200:
            raise InvalidInput(f"audio must be mono samples at {SAMPLE_RATE} Hz, more than 200 of them",
                               f"got shape {list(wave.shape)}", "send a longer clip")
        mel = log_mel(wave, n_mels=self.aut.num_mel_bins)
        return mel, num_tokens(mel.shape[1], self.aut)

    def _prepare(self, item: Media):
        where = getattr(self.encoders, item.kind)
        if where is None:
            raise InvalidInput(f"this model takes no {item.kind} input", f"it takes: {', '.join(self.token_of) or 'text'}",
                               f"send no {item.kind} parts to it")
        if item.kind == "audio":
            return self._mel(item.data)
        frames = torch.as_tensor(item.data)
        if item.kind == "image":
            vi = self.node_dtype(process_image(frames, self.vision))
        else:
            if not item.fps or item.fps <= 0:
                raise InvalidInput("a video needs its sampling rate", f"fps is {item.fps}", "pass the frames' fps")
            vi = self.node_dtype(process_video(frames, self.vision))
            if item.audio is not None:
                if self.encoders.audio_in_video is None or self.encoders.audio is None:
                    raise InvalidInput("this model cannot hear a video's sound (use_audio_in_video)",
                                       "it has no walk that runs the audio and vision encoders together",
                                       "leave use_audio_in_video off")
                return (vi, *self._mel(item.audio)), vi.num_patches // self.vcfg.merge_unit
        return vi, vi.num_patches // self.vcfg.merge_unit

    def node_dtype(self, vi: VisionItem) -> VisionItem:
        """A processed image or clip, its patches in the vision node's input dtype: cast where the request is
        prepared, not on the engine's thread or the device (in bf16 half the bytes to hash, pack and copy; the
        same rounding as a cast after the copy)."""
        return VisionItem(vi.patches.to(self.patch_dtype), vi.grid_thw)

    def _interleaved(self, vi: VisionItem, seconds_per_grid: float, audio_tokens: int) -> list[str]:
        """HF's audio-in-video layout: each temporal grid's video tokens at its start time (grid x
        seconds x position_id_per_seconds), the audio tokens (one position each) between, video first on
        ties. 'v' and 'a' for each token, in prompt order."""
        t, h, w = vi.grid_thw
        per = h * w // self.vcfg.merge_unit
        video = [k * seconds_per_grid * self.media.position_id_per_seconds for k in range(t) for _ in range(per)]
        out, vi_, ai = [], 0, 0
        while vi_ < len(video) and ai < audio_tokens:
            if video[vi_] <= ai:
                out.append("v")
                vi_ += 1
            else:
                out.append("a")
                ai += 1
        return out + ["v"] * (len(video) - vi_) + ["a"] * (audio_tokens - ai)

    def _pieces(self, kind: str, data, rows: list[int], node: str) -> list[Piece]:
        if kind == "audio":
            step, out, at = self.aut.n_window_infer, [], 0
            for start in range(0, data.shape[1], step):
                mel = data[:, start:start + step]
                n = num_tokens(mel.shape[1], self.aut)
                out.append(Piece(units=1, segments=1, rows=rows[at:at + n], data=mel, node=node))
                at += n
            return out
        if kind == "image":
            return [Piece(units=data.num_patches, segments=1, rows=rows, data=data, node=node)]
        t, h, w = data.grid_thw
        per, merged = h * w, h * w // self.vcfg.merge_unit
        return [Piece(units=per, segments=1, rows=rows[k * merged:(k + 1) * merged], node=node,
                      data=VisionItem(data.patches[k * per:(k + 1) * per], (1, h, w))) for k in range(t)]

    def prompt(self, ids: list[int], media: list[Media]) -> Prompt:
        prepared = [self._prepare(m) for m in media]
        reps, layouts = [], []
        for m, (data, n) in zip(media, prepared):
            if m.kind == "video" and m.audio is not None:
                vi, _, audio_tokens = data
                layout = self._interleaved(vi, self.vision.temporal_patch_size / m.fps, audio_tokens)
                token = {"v": self.media.video_token_id, "a": self.media.audio_token_id}
                reps.append([self.media.audio_start_token_id] + [token[x] for x in layout] + [self.audio_end])
                layouts.append(layout)
            else:
                reps.append([self.token_of[m.kind]] * n)
                layouts.append(None)
        expanded, starts = expand_placeholders(ids, media, self.token_of, reps)
        if self.mrope:
            audio_lengths, images, videos, seconds = [], [], [], []
            for m, (data, n) in zip(media, prepared):
                if m.kind == "audio":
                    audio_lengths.append(n)
                elif m.kind == "image":
                    images.append(data.grid_thw)
                else:
                    vi = data[0] if m.audio is not None else data
                    videos.append(vi.grid_thw)
                    seconds.append(self.vision.temporal_patch_size / m.fps)
                    if m.audio is not None:
                        audio_lengths.append(data[2])
            positions, delta = rope_index(expanded, self.media, audio_lengths=audio_lengths, image_grid_thw=images,
                                          video_grid_thw=videos, video_second_per_grid=seconds)
        else:
            positions, delta = torch.arange(len(expanded), dtype=torch.int64)[None], 0
        items = []
        for m, (data, n), start, layout in zip(media, prepared, starts, layouts):
            if layout is None:
                node, walk = getattr(self.encoders, m.kind)
                rows = list(range(start, start + n))
                items.append(MediaItem(walk=walk, node=node, kind=m.kind, pieces=self._pieces(m.kind, data, rows, node)))
                continue
            vi, mel, _ = data
            walk = self.encoders.audio_in_video
            vrows = [start + 1 + i for i, x in enumerate(layout) if x == "v"]
            arows = [start + 1 + i for i, x in enumerate(layout) if x == "a"]
            vnode, anode = self.encoders.video[0], self.encoders.audio[0]
            items += [MediaItem(walk=walk, node=vnode, kind="video", pieces=self._pieces("video", vi, vrows, vnode)),
                      MediaItem(walk=walk, node=anode, kind="audio", pieces=self._pieces("audio", mel, arows, anode))]
        rope = dict(audio_lengths=audio_lengths, image_grid_thw=images, video_grid_thw=videos,
                    video_second_per_grid=seconds) if self.mrope else {}
        return Prompt(ids=expanded, positions=positions, delta=delta, media=items, rope=rope)

    # ---- encoder steps
    def encode(self, node: str, pieces: list[Piece], units: int) -> EncodeBatch:
        if self.encoders.audio and node == self.encoders.audio[0]:
            step = pack_audios([p.data for p in pieces], units, self.aut)
            return EncodeBatch({"mel": step.mel, "rows": step.rows}, {"attn": step.cu_seqlens}, step.offsets)
        step = build_step([p.data for p in pieces], self.vcfg, patches=units)
        return EncodeBatch(step.inputs(), {"attn": step.cu_seqlens}, step.token_offsets[:-1])


def checkpoint_config(checkpoint: str | None) -> dict | None:
    """The checkpoint's config.json as a dict (None without a checkpoint)."""
    from graphc import read_config

    return None if checkpoint is None else read_config(checkpoint)


def vision_processing(checkpoint: str | None) -> VisionProcessing:
    """Pixel bounds, mean and std from the checkpoint's preprocessor_config.json (images) and
    video_preprocessor_config.json (videos), HF's keys (min_pixels/max_pixels or size.shortest_edge /
    size.longest_edge); HF's Qwen2-VL defaults where a file or key is absent."""
    import json
    from pathlib import Path

    out = VisionProcessing()
    if checkpoint is None:
        return out

    def bounds(path: Path, lo: str, hi: str) -> dict:
        if not path.is_file():
            return {}
        d = json.loads(path.read_text())
        size = d.get("size") or {}
        got = {lo: d.get("min_pixels", size.get("shortest_edge")), hi: d.get("max_pixels", size.get("longest_edge")),
               "image_mean": d.get("image_mean"), "image_std": d.get("image_std")}
        return {k: tuple(v) if isinstance(v, list) else v for k, v in got.items() if v is not None}

    update = bounds(Path(checkpoint) / "preprocessor_config.json", "min_pixels", "max_pixels")
    video = bounds(Path(checkpoint) / "video_preprocessor_config.json", "video_min_pixels", "video_max_pixels")
    update |= {k: v for k, v in video.items() if k.startswith("video_")}
    return VisionProcessing(**{**out.model_dump(), **update})


def special_token(checkpoint: str | None, text: str, default: int) -> int:
    """A special token's id from the checkpoint's tokenizer.json (config.json does not name every one)."""
    from pathlib import Path

    if checkpoint is not None and (Path(checkpoint) / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        found = Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json")).token_to_id(text)
        if found is not None:
            return found
    return default


def generation_eos(checkpoint: str, cfg: dict) -> tuple[int, ...]:
    """End-of-sequence ids: generation_config.json's eos_token_id, else config.json's (an int or a list)."""
    import json
    from pathlib import Path

    gen = Path(checkpoint) / "generation_config.json"
    eos = json.loads(gen.read_text()).get("eos_token_id") if gen.is_file() else None
    if eos is None:
        eos = cfg.get("eos_token_id", cfg.get("thinker_config", {}).get("text_config", {}).get("eos_token_id"))
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)
