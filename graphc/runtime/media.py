"""Media as users have them. Audio: a file or its bytes (WAV, FLAC, OGG, MP3: whatever libsndfile
reads) to the mono float32 waveform at the model's sample rate. Images: a file or its bytes
(whatever Pillow reads) to RGB uint8 [3, H, W], turned upright by its EXIF orientation and
without alpha, as HF's load_image gives them to its processors.

soundfile decodes, soxr resamples (its high-quality setting, as librosa's default that HF's
processors use), channels are averaged. The length is checked from the header before anything is
decoded, so a two-hour upload is refused without the work; an image's size likewise. No torchaudio: its version pairing with
torch breaks installs.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from graphc.serving import Media, SpreadFrames


class MediaError(ValueError):
    """Input media that cannot be used: the message says what, why and what to send instead."""


def _source(data: bytes | str | Path):
    return io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else str(data)


AUDIO_RATE = 16_000            # the sample rate the audio encoders (and Silero's VAD) take


def load_audio(data: bytes | str | Path, sample_rate: int = AUDIO_RATE, max_seconds: float | None = None,
               why: str = "") -> np.ndarray:
    """Decode, downmix and resample: float32 [n] at `sample_rate`. Longer than max_seconds (read from the
    header) is refused undecoded, the refusal saying `why` that is the limit."""
    import soundfile as sf
    import soxr

    try:
        info = sf.info(_source(data))
    except Exception as e:       # libsndfile's own message says which format it saw
        raise MediaError(f"the audio does not decode: {e}; send WAV, FLAC, OGG or MP3") from e
    seconds = info.frames / info.samplerate if info.samplerate else 0.0
    if max_seconds is not None and seconds > max_seconds:
        raise MediaError(f"the audio is {seconds:.1f} s long, at most {max_seconds:.1f} s is allowed"
                         f"{f' ({why})' if why else ''}; send a shorter clip or split it")
    try:
        wave, rate = sf.read(_source(data), dtype="float32", always_2d=True)
    except Exception as e:
        raise MediaError(f"the audio does not decode: {e}; send WAV, FLAC, OGG or MP3") from e
    if wave.shape[0] == 0:
        raise MediaError("the audio holds no samples; send at least one mel frame (10 ms)")
    mono = wave.mean(axis=1)
    if rate != sample_rate:
        mono = soxr.resample(mono, rate, sample_rate, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32)


MAX_IMAGE_PIXELS = 64 * 1024 * 1024       # 8192 x 8192: what a decoded image may hold by default


def load_image(data: bytes | str | Path, max_pixels: int = MAX_IMAGE_PIXELS):
    """Decode to torch uint8 [3, H, W] RGB, upright; refused from the header when over max_pixels."""
    import torch
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        img = Image.open(_source(data))
    except Image.DecompressionBombError as e:       # Pillow's own bound (twice its 89 M pixels) met at open
        raise MediaError(f"the image is too large to open ({e}); at most {max_pixels:,} pixels are allowed; "
                         "send it smaller") from e
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise MediaError(f"the image does not decode: {e}; send PNG, JPEG, WebP, GIF or BMP") from e
    w, h = img.size
    if w * h > max_pixels:
        raise MediaError(f"the image is {w} x {h} = {w * h:,} pixels, at most {max_pixels:,} are allowed; "
                         "send it smaller (the model sees at most a few megapixels anyway)")
    try:
        img = ImageOps.exif_transpose(img).convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:   # truncated or corrupt pixels
        raise MediaError(f"the image does not decode: {e}; send the whole file") from e
    return torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).reshape(img.height, img.width, 3).permute(
        2, 0, 1).contiguous()


VIDEO_FPS = 2.0          # frames a second taken from a video (HF's video processors' default)
MAX_VIDEO_FRAMES = 768
MAX_VIDEO_BYTES = 2 << 30    # the decoded RGB frames one video may hold (2 GiB)


def _open_av(data: bytes | str | Path):
    """A PyAV container of a video file or its bytes; what does not open is refused."""
    import av

    try:
        return av.open(_source(data))
    except (av.error.FFmpegError, OSError) as e:
        raise MediaError(f"the video does not decode: {e}; send MP4, WebM, MKV or AVI") from e


def load_video(data: bytes | str | Path, fps: float | None = None, max_frames: int = MAX_VIDEO_FRAMES,
               max_pixels: int = MAX_IMAGE_PIXELS, why: str = "", spread: SpreadFrames | None = None) -> Media:
    """Decode with PyAV and sample `fps` frames a second (default: spread.fps, else 2): a video Media, uint8
    [F, 3, H, W] RGB.
    Without `spread`, frames are taken at the stream times nearest k / fps. With it, the frames at
    spread.indices() of the clip (its frame count from the header, else its packets counted; its rate the
    stream's average rate), each frame's time (index / rate) in Media.times. An even count (two frames make one
    temporal patch) is kept by repeating the last when needed. video_audio() reads the same file's sound. More
    than max_frames (or than MAX_VIDEO_BYTES of decoded frames hold) is refused before decoding where the
    header or the spread tells, the refusal saying `why` that is the limit."""
    fps = float(fps) if fps is not None else float(spread.fps) if spread is not None and spread.fps else VIDEO_FPS
    if not 0 < fps <= 60:
        raise MediaError(f"fps {fps} is out of range; sample between 0 and 60 frames a second")
    with _open_av(data) as container:
        stream, max_frames = _video_stream(container, max_pixels, max_frames)
        limit = f"at most {max_frames} are taken of a {stream.codec_context.width} x " \
                f"{stream.codec_context.height} video{f' ({why})' if why else ''}; send a shorter clip or a lower fps"
        keep = _spread(data, stream, spread, fps) if spread is not None else None
        if keep is not None and len(keep) > max_frames:
            raise MediaError(f"the video gives {len(keep)} frames at {fps:g} fps, {limit}")
        seconds = _seconds(container, stream)
        if keep is None and seconds is not None and int(seconds * fps) > max_frames + 1:    # refused undecoded
            raise MediaError(f"the video is {seconds:.1f} s long: {int(seconds * fps)} frames at {fps:g} fps, {limit}")
        frames, indices = _decode(container, stream, fps, keep, max_frames, limit)
        rate = float(stream.average_rate) if keep is not None else None
    if not frames:
        raise MediaError("the video has no frames")
    if len(frames) % 2:
        frames.append(frames[-1])
        indices.append(indices[-1])
    import torch

    return Media("video", torch.stack(frames), fps,
                 times=tuple(i / rate for i in indices) if rate else None)


def _video_stream(container, max_pixels: int, max_frames: int):
    """The first video stream, its frame size checked; max_frames lowered to what MAX_VIDEO_BYTES holds."""
    if not container.streams.video:
        raise MediaError("the file has no video stream; send a video")
    stream = container.streams.video[0]
    w, h = stream.codec_context.width, stream.codec_context.height
    if w * h > max_pixels:
        raise MediaError(f"the video is {w} x {h}, over {max_pixels:,} pixels a frame; send it smaller")
    if w * h and max_frames * 3 * w * h > MAX_VIDEO_BYTES:     # what the decoded frames may hold
        max_frames = max(MAX_VIDEO_BYTES // (3 * w * h), 2)
    return stream, max_frames


def _seconds(container, stream) -> float | None:
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    return container.duration / 1e6 if container.duration else None


def _spread(data, stream, spread: SpreadFrames, fps: float) -> list[int]:
    """spread.indices() of the clip: its frames from the header, else its video packets counted (a second pass
    over the file that decodes nothing); its rate the stream's average rate."""
    if not stream.average_rate:
        raise MediaError("the video's header gives no frame rate; send an MP4 or WebM that states one")
    total = stream.frames
    if not total:
        with _open_av(data) as again:
            total = sum(1 for packet in again.demux(again.streams.video[0]) if packet.size)
    return spread.indices(total, float(stream.average_rate), fps)


def _decode(container, stream, fps: float, keep: list[int] | None, max_frames: int, limit: str):
    """The frames kept and their indices in decode order: those in `keep` (distinct, ascending), else the first
    at or after each k / fps."""
    import av
    import torch

    frames, indices, next_t = [], [], 0.0
    if keep == []:
        return frames, indices
    wanted = set(keep) if keep is not None else None
    try:
        for i, frame in enumerate(container.decode(stream)):
            if wanted is not None:
                if i > keep[-1]:
                    break
                take = i in wanted
            else:
                take = float(frame.time or 0.0) + 1e-6 >= next_t
                next_t += take / fps
            if take:
                frames.append(torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1))
                indices.append(i)
            if len(frames) > max_frames:
                raise MediaError(f"the video gives more than {max_frames} frames at {fps:g} fps; {limit}")
    except av.error.FFmpegError as e:
        raise MediaError(f"the video does not decode: {e}; send the whole file") from e
    return frames, indices


def video_audio(data: bytes | str | Path, sample_rate: int = AUDIO_RATE, max_seconds: float | None = None,
                why: str = "") -> np.ndarray:
    """A video file's first audio stream, decoded with PyAV, channels averaged, resampled with soxr:
    float32 [n] at `sample_rate` (what a model hears with use_audio_in_video)."""
    import av
    import soxr

    with _open_av(data) as container:
        if not container.streams.audio:
            raise MediaError("use_audio_in_video: the video has no audio stream; send one with sound or leave it off")
        stream = container.streams.audio[0]
        rate = stream.codec_context.sample_rate
        chunks = []
        try:
            for frame in container.decode(stream):
                x = frame.to_ndarray().astype(np.float32)
                if frame.format.name in ("s16", "s16p"):
                    x /= 32768.0
                elif frame.format.name in ("s32", "s32p"):
                    x /= 2147483648.0
                if not frame.format.is_planar:       # packed: [1, n * channels], interleaved
                    x = x.reshape(-1, len(frame.layout.channels)).T
                chunks.append(x.mean(axis=0))
        except av.error.FFmpegError as e:
            raise MediaError(f"the video's audio does not decode: {e}") from e
    wave = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    if max_seconds is not None and wave.size > max_seconds * rate:
        raise MediaError(f"the video's audio is {wave.size / rate:.1f} s, at most {max_seconds:g} s are allowed"
                         f"{f' ({why})' if why else ''}")
    if wave.size <= 200 * rate / sample_rate:
        raise MediaError("the video's audio is too short to hear (at most 12.5 ms)")
    return soxr.resample(wave, rate, sample_rate, quality="HQ").astype(np.float32) if rate != sample_rate else wave
