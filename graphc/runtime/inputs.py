"""Chat messages as users send them -> what the chat template renders and the media the host encodes.

Content parts taken (OpenAI's shapes, and file paths for offline batches):
  {"type": "text", "text": ...}
  {"type": "input_audio", "input_audio": {"data": BASE64, "format": "wav"|"flac"|"mp3"|"ogg"}}
  {"type": "image_url", "image_url": {"url": "data:image/...;base64,..." | "file:///path" | path}}
  {"type": "video_url", "video_url": {"url": ... as above}}
  {"type": "audio" | "image" | "video", "path": FILE}        (offline; video may set "fps")
With use_audio_in_video each video also brings its sound track (PyAV decodes it, soxr resamples it).
Each media part becomes a {"type": "audio"|"image"|"video"} part for the template (which writes its
placeholder) and a decoded Media item, in order. Anything else is refused by name. An assistant message
may carry OpenAI's tool_calls (its content then may be null or absent; each call's arguments the text of a
JSON object) and a tool message the tool_call_id it answers; both go to the template as sent.

Where media may come from is the caller's `Sources`: an offline batch reads any path it names (the
operator wrote it); the server reads none unless started with --media-dir DIR (then only files under
DIR) and fetches web addresses only with --media-urls (graphc/serve/fetch.py: a size and a time
limit, no private addresses). `Limits` bound what is decoded, from the file's header where it says:
the seconds of audio and frames of video a plan's longest prompt can hold.
"""
from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from pathlib import Path

from graphc.errors import InvalidInput
from graphc.serving import Media, SpreadFrames
from graphc.runtime.media import MediaError, load_audio, load_image


@dataclass(frozen=True)
class Sources:
    """Where a request's media may come from. paths: any file (True), none (False), or files under this
    folder; urls: a fetch(url, kind) -> bytes for http(s) addresses, or None (refused)."""

    paths: bool | Path = True
    urls: object = None

    def read(self, path: str, what: str) -> str:
        if self.paths is True:
            return path
        if self.paths is False:
            raise InvalidInput(f"{what} names a file on the server ({path!r})", "this server reads no files for requests",
                               "send the bytes as base64 (a data URL or input_audio), or start the server with "
                               "--media-dir DIR and name files under DIR")
        root = Path(self.paths).resolve()
        full = (root / path).resolve()
        if not full.is_relative_to(root):
            raise InvalidInput(f"{what} names {path!r}, outside the media folder", f"this server reads files under "
                               f"{root} only", "name a file under that folder, or send the bytes as base64")
        return str(full)


OFFLINE = Sources()
SERVED = Sources(paths=False)


@dataclass(frozen=True)
class Limits:
    """The most a media item may hold, checked before or while decoding (None: no bound); why: what
    sets them, said in a refusal."""

    audio_seconds: float | None = None
    video_frames: int | None = None
    why: str = ""
    spread: SpreadFrames | None = None      # how a video's frames are sampled (Host.video_frames)

URL_KEYS = {"image_url": "image", "video_url": "video"}
DATA_PREFIX = {"image": "data:image/", "video": "data:video/"}


def _b64(data: str, what: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise InvalidInput(f"{what} is not valid base64", "", "encode the file's bytes with base64") from None


def _url(url: str, kind: str, what: str, sources: Sources) -> bytes | str:
    if not isinstance(url, str) or not url:
        raise InvalidInput(f"{what}.url must be a non-empty string", f"got {url!r}", "send a data URL or a file path")
    if url.startswith("data:"):
        head, _, body = url.partition(",")
        if not head.startswith(DATA_PREFIX[kind]) or not head.endswith(";base64"):
            raise InvalidInput(f"{what}.url is a data URL of '{head[5:]}'", f"a {kind} part needs {DATA_PREFIX[kind]}*;base64",
                               f"send the {kind} as {DATA_PREFIX[kind]}<format>;base64,<data>")
        return _b64(body, f"{what}.url's data")
    if url.startswith(("http://", "https://")):
        if sources.urls is None:
            raise InvalidInput(f"{what}.url is a web address", "this server fetches no URLs (it was started "
                               "without --media-urls)", "send the bytes as a base64 data URL")
        return sources.urls(url, kind)
    if url.startswith("file://"):
        url = url[7:]
    elif ":" in url.split("/", 1)[0]:
        raise InvalidInput(f"{what}.url has the scheme '{url.split(':', 1)[0]}'", "taken: data:, http(s):, file: "
                           "and paths", "send the bytes as a base64 data URL")
    return sources.read(url, f"{what}.url")


def load_media(kind: str, source: bytes | str, what: str, fps: float | None = None, with_audio: bool = False,
               limits: Limits = Limits()) -> Media:
    """One media item decoded within `limits` (a video sampled as they say), or refused naming `what`."""
    why = limits.why
    if not isinstance(source, (bytes, bytearray)) and (source is None or not Path(source).is_file()):
        raise InvalidInput(f"{what}: {source} cannot be read", "no such file" if source is not None else
                           "it names no file", "check the path")
    try:
        if kind == "audio":
            return Media("audio", load_audio(source, max_seconds=limits.audio_seconds, why=why))
        if kind == "image":
            return Media("image", load_image(source))
        from graphc.runtime.media import MAX_VIDEO_FRAMES, load_video, video_audio
        most = min(MAX_VIDEO_FRAMES, limits.video_frames or MAX_VIDEO_FRAMES)
        clip = load_video(source, fps=fps, max_frames=most, spread=limits.spread,
                          why=why if most < MAX_VIDEO_FRAMES else "the most frames graphc takes of a video")
        if with_audio:
            clip.audio = video_audio(source, max_seconds=limits.audio_seconds, why=why)
        return clip
    except MediaError as e:
        raise InvalidInput(f"{what}: {e}", "", f"send {'an' if kind[0] in 'ai' else 'a'} {kind} file that decodes "
                           "and fits") from None
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        raise InvalidInput(f"{what}: {source} cannot be read ({e.strerror})", "", "check the path") from None


ROLES = ("system", "developer", "user", "assistant", "tool")      # OpenAI's chat roles ("developer" is system)


def _message(m, i: int) -> dict:
    """messages[i] with its role checked (developer is system) and its tool fields checked."""
    if isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls"):
        m = {"content": None, **m, "tool_calls": _tool_calls(m["tool_calls"], i)}
    if not isinstance(m, dict) or "role" not in m or "content" not in m:
        raise InvalidInput(f"messages[{i}] needs role and content", f"got {m!r:.80}", "")
    if not isinstance(m["role"], str):
        raise InvalidInput(f"messages[{i}].role must be a string", f"got {m['role']!r:.40}",
                           f"use one of {', '.join(ROLES)}")
    if m["role"] not in ROLES:
        raise InvalidInput(f"messages[{i}].role '{m['role']:.40}' is not a chat role",
                           f"the roles are {', '.join(ROLES)}", "send one of those")
    if m["role"] == "tool" and (not isinstance(m.get("tool_call_id"), str) or not m["tool_call_id"]):
        raise InvalidInput(f"messages[{i}] (role tool) needs tool_call_id", "a tool result answers one call of "
                           "the assistant's tool_calls", "send the id of the call it answers")
    if m["role"] == "developer":               # OpenAI's newer name for system: the templates know system
        m = {**m, "role": "system"}
    return m


def split_messages(messages: list, use_audio_in_video: bool = False, sources: Sources = OFFLINE,
                   limits: Limits = Limits()) -> tuple[list[dict], list[Media]]:
    """use_audio_in_video: each video is heard with its own sound track (a model's option); sources:
    where media may be read from; limits: the most an item may hold."""
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages must be a non-empty list", f"got {type(messages).__name__}", "send [{role, content}]")
    out, media = [], []
    for i, m in enumerate(messages):
        m = _message(m, i)
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
                if not isinstance(part.get("text", ""), str):
                    raise InvalidInput(f"{what}.text must be a string", f"got {type(part['text']).__name__}", "")
                parts.append({"type": "text", "text": part.get("text", "")})
            elif kind == "input_audio":
                spec = part.get("input_audio") or {}
                if not isinstance(spec, dict) or not isinstance(spec.get("data"), str):
                    raise InvalidInput(f"{what}.input_audio needs data, a base64 string", f"got {spec!r:.80}",
                                       "send {\"data\": BASE64, \"format\": \"wav\"}")
                media.append(load_media("audio", _b64(spec["data"], f"{what}.input_audio.data"), what, limits=limits))
                parts.append({"type": "audio"})
            elif kind in URL_KEYS:
                spec = part.get(kind)
                if not isinstance(spec, dict):
                    raise InvalidInput(f"{what}.{kind} must be an object {{url}}", f"got {spec!r:.80}", "send {\"url\": ...}")
                media.append(load_media(URL_KEYS[kind], _url(spec.get("url"), URL_KEYS[kind], f"{what}.{kind}", sources),
                                    what, _fps(part.get("fps"), what), use_audio_in_video, limits))
                parts.append({"type": URL_KEYS[kind]})
            elif kind in ("audio", "image", "video") and "path" in part:
                if not isinstance(part["path"], str) or not part["path"]:
                    raise InvalidInput(f"{what}.path must be a non-empty string", f"got {part['path']!r:.80}", "")
                media.append(load_media(kind, sources.read(part["path"], f"{what}.path"), what, _fps(part.get("fps"), what),
                                    use_audio_in_video, limits))
                parts.append({"type": kind})
            else:
                raise InvalidInput(f"{what} has type {kind!r}", "parts: text, input_audio, image_url, video_url "
                                   "(or audio/image/video with a path, offline)", "send one of those")
        out.append({**m, "content": parts})
    return out, media


def _tool_calls(calls, i: int) -> list:
    """An assistant message's tool_calls as OpenAI has them: [{id, type "function", function {name, arguments:
    a JSON object as text}}]."""
    fix = "send [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": NAME, \"arguments\": JSON}}]"
    if not isinstance(calls, list):
        raise InvalidInput(f"messages[{i}].tool_calls must be a list", f"got {type(calls).__name__}", fix)
    for j, c in enumerate(calls):
        what = f"messages[{i}].tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if (not isinstance(fn, dict) or c.get("type", "function") != "function" or not isinstance(c.get("id"), str)
                or not isinstance(fn.get("name"), str) or not fn["name"] or not isinstance(fn.get("arguments"), str)):
            raise InvalidInput(f"{what} is not a function call", f"got {c!r:.120}", fix)
        try:
            args = json.loads(fn["arguments"])
        except ValueError:
            args = None
        if not isinstance(args, dict):
            raise InvalidInput(f"{what}.function.arguments is not a JSON object", f"got {fn['arguments']!r:.80}",
                               "send the arguments as the text of a JSON object, e.g. json.dumps(args)")
    return calls


def _fps(fps, what: str) -> float | None:
    if fps is None:
        return None
    if isinstance(fps, bool) or not isinstance(fps, (int, float)):
        raise InvalidInput(f"{what}.fps must be a number", f"got {fps!r:.40}", "send frames a second, e.g. 2")
    return float(fps)
