"""Chat messages as users send them -> what the chat template renders and the media the host encodes.

Content parts taken (OpenAI's shapes, and file paths for offline batches):
  {"type": "text", "text": ...}
  {"type": "input_audio", "input_audio": {"data": BASE64, "format": "wav"|"flac"|"mp3"|"ogg"}}
  {"type": "image_url", "image_url": {"url": "data:image/...;base64,..." | "file:///path" | path}}
  {"type": "video_url", "video_url": {"url": ... as above}}
  {"type": "audio" | "image" | "video", "path": FILE}        (offline; video may set "fps")
With use_audio_in_video each video also brings its sound track (PyAV decodes it, soxr resamples it).
Each media part becomes a {"type": "audio"|"image"|"video"} part for the template (which writes its
placeholder) and a decoded Media item, in order. Anything else is refused by name.
"""
from __future__ import annotations

import base64
import binascii
from pathlib import Path

from graphc.errors import InvalidInput
from graphc.runtime.host import Media
from graphc.runtime.media import MediaError, load_audio, load_image

URL_KEYS = {"image_url": "image", "video_url": "video"}
DATA_PREFIX = {"image": "data:image/", "video": "data:video/"}


def _b64(data: str, what: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise InvalidInput(f"{what} is not valid base64", "", "encode the file's bytes with base64") from None


def _url(url: str, kind: str, what: str) -> bytes | str:
    if not isinstance(url, str) or not url:
        raise InvalidInput(f"{what}.url must be a non-empty string", f"got {url!r}", "send a data URL or a file path")
    if url.startswith("data:"):
        head, _, body = url.partition(",")
        if not head.startswith(DATA_PREFIX[kind]) or not head.endswith(";base64"):
            raise InvalidInput(f"{what}.url is a data URL of '{head[5:]}'", f"a {kind} part needs {DATA_PREFIX[kind]}*;base64",
                               f"send the {kind} as {DATA_PREFIX[kind]}<format>;base64,<data>")
        return _b64(body, f"{what}.url's data")
    if url.startswith(("http://", "https://")):
        raise InvalidInput(f"{what}.url is a web address", "the server does not fetch URLs",
                           "send the bytes as a base64 data URL")
    return url[7:] if url.startswith("file://") else url


def _media(kind: str, source: bytes | str, what: str, fps: float | None = None, with_audio: bool = False) -> Media:
    try:
        if kind == "audio":
            return Media("audio", load_audio(source))
        if kind == "image":
            return Media("image", load_image(source))
        from graphc.runtime.media import load_video, video_audio
        frames, rate = load_video(source, fps=fps)
        return Media("video", frames, rate, audio=video_audio(source) if with_audio else None)
    except MediaError as e:
        raise InvalidInput(f"{what}: {e}", "", f"send a {kind} file that decodes") from None
    except FileNotFoundError:
        raise InvalidInput(f"{what}: {source} does not exist", "", "check the path") from None


def split_messages(messages: list, use_audio_in_video: bool = False) -> tuple[list[dict], list[Media]]:
    """use_audio_in_video: each video is heard with its own sound track (Qwen3-Omni's option)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages must be a non-empty list", f"got {type(messages).__name__}", "send [{role, content}]")
    out, media = [], []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise InvalidInput(f"messages[{i}] needs role and content", f"got {m!r:.80}", "")
        content = m["content"]
        if isinstance(content, str) or content is None:
            out.append({**m, "content": content or ""})
            continue
        if not isinstance(content, list):
            raise InvalidInput(f"messages[{i}].content must be a string or a list of parts", "", "")
        parts = []
        for j, part in enumerate(content):
            what = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": part.get("text", "")})
            elif kind == "input_audio":
                spec = part.get("input_audio") or {}
                media.append(_media("audio", _b64(spec.get("data", ""), f"{what}.input_audio.data"), what))
                parts.append({"type": "audio"})
            elif kind in URL_KEYS:
                media.append(_media(URL_KEYS[kind], _url((part.get(kind) or {}).get("url"), URL_KEYS[kind], f"{what}.{kind}"),
                                    what, part.get("fps"), use_audio_in_video))
                parts.append({"type": URL_KEYS[kind]})
            elif kind in ("audio", "image", "video") and "path" in part:
                media.append(_media(kind, str(Path(part["path"])), what, part.get("fps"), use_audio_in_video))
                parts.append({"type": kind})
            else:
                raise InvalidInput(f"{what} has type {kind!r}", "parts: text, input_audio, image_url, video_url "
                                   "(or audio/image/video with a path, offline)", "send one of those")
        out.append({**m, "content": parts})
    return out, media
