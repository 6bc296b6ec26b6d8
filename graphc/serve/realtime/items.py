"""Conversation items on the wire: a client's item read into an Item (its audio resampled to 16 kHz, its
image decoded), and an Item shown as the protocol's JSON.

Taken: {type: "message", role, content, id?, object?, status?}; a user's content parts input_text {text},
input_audio {audio: base64 24 kHz pcm16, transcript?} and input_image {image_url: a data URL, detail?}; a
system message's input_text; an assistant's output_text (beta: text) {text} or output_audio (beta: audio)
{transcript}. Anything else (function calls, other parts, unknown keys) is refused by name.
"""
from __future__ import annotations

from graphc.errors import InvalidInput
from graphc.runtime.inputs import Limits, Sources, split_messages
from graphc.runtime.media import AUDIO_RATE
from graphc.serve.realtime.audio import WIRE_RATE, Resampler, decode_pcm16
from graphc.serve.realtime.conversation import Item, Part
from graphc.serve.realtime.protocol import Wire, new_id
from graphc.serving import Media

ITEM_KEYS = {"id", "type", "role", "content", "object", "status"}
MAX_ID = 32


def _check_keys(obj: dict, allowed: set, where: str) -> None:
    for key in obj:
        if key not in allowed:
            raise InvalidInput(f"unknown key '{key}' in {where}", f"{where} takes {', '.join(sorted(allowed))}",
                               f"leave '{key}' out", param=f"{where}.{key}")


def _text(part: dict, where: str) -> str:
    if not isinstance(part.get("text"), str):
        raise InvalidInput(f"{where}.text must be a string", f"got {part.get('text')!r:.40}", "", param=f"{where}.text")
    return part["text"]


def _user_part(part: dict, where: str, sources: Sources, limits: Limits) -> Part:
    kind = part.get("type")
    if kind == "input_text":
        _check_keys(part, {"type", "text"}, where)
        return Part("text", _text(part, where))
    if kind == "input_audio":
        _check_keys(part, {"type", "audio", "transcript"}, where)
        wave = Resampler(WIRE_RATE, AUDIO_RATE)(decode_pcm16(part.get("audio"), f"{where}.audio"), last=True)
        if limits.audio_seconds is not None and len(wave) > limits.audio_seconds * AUDIO_RATE:
            raise InvalidInput(f"{where}.audio is {len(wave) / AUDIO_RATE:.1f} s long",
                               f"at most {limits.audio_seconds:.1f} s ({limits.why})", "send a shorter clip",
                               param=f"{where}.audio")
        return Part("audio", part.get("transcript"), Media("audio", wave))
    if kind == "input_image":
        _check_keys(part, {"type", "image_url", "detail"}, where)
        url = part.get("image_url")
        if not isinstance(url, str) or not url.startswith("data:image/"):
            raise InvalidInput(f"{where}.image_url must be a data URL of an image", f"got {str(url)[:40]!r}",
                               "send data:image/png;base64,...", param=f"{where}.image_url")
        try:
            _, media = split_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
                                      sources=sources, limits=limits)
        except InvalidInput as e:
            raise InvalidInput(f"{where}.image_url: {e.what.split(': ', 1)[-1]}", e.why, e.fix,
                               param=f"{where}.image_url") from None
        return Part("image", media=media[0])
    raise InvalidInput(f"{where} has type {kind!r}", "a user's parts: input_text, input_audio, input_image",
                       "send one of those", param=f"{where}.type")


def _other_part(part: dict, role: str, where: str, wire: Wire) -> Part:
    kind = part.get("type")
    if role == "system" and kind == "input_text":
        _check_keys(part, {"type", "text"}, where)
        return Part("text", _text(part, where))
    if role == "assistant" and kind == wire.content_type("text"):
        _check_keys(part, {"type", "text"}, where)
        return Part("text", _text(part, where))
    if role == "assistant" and kind == wire.content_type("audio"):
        _check_keys(part, {"type", "transcript", "audio"}, where)
        if part.get("audio") is not None:
            raise InvalidInput(f"{where}.audio: an assistant's audio is not taken", "later turns read its "
                               "transcript", "send the transcript alone", param=f"{where}.audio")
        return Part("text", part.get("transcript") or "")
    kinds = "input_text" if role == "system" else f"{wire.content_type('text')}, {wire.content_type('audio')}"
    raise InvalidInput(f"{where} has type {kind!r}", f"a {role}'s parts: {kinds}", "send one of those",
                       param=f"{where}.type")


def read_item(item, wire: Wire, sources: Sources, limits: Limits) -> Item:
    """A client's conversation item as an Item; InvalidInput naming what is wrong."""
    if not isinstance(item, dict):
        raise InvalidInput("item must be an object", f"got {type(item).__name__}", "send {type: message, ...}",
                           param="item")
    _check_keys(item, ITEM_KEYS, "item")
    if item.get("type") != "message":
        raise InvalidInput(f"item.type {item.get('type')!r} is not served", "items are messages (no function calls)",
                           "send type 'message'", param="item.type")
    role = item.get("role")
    if role not in ("user", "assistant", "system"):
        raise InvalidInput(f"item.role {role!r}", "roles: user, assistant, system", "send one", param="item.role")
    iid = item.get("id") or new_id("item")
    if not isinstance(iid, str) or len(iid) > MAX_ID:
        raise InvalidInput(f"item.id {iid!r:.40}", f"an id is a string of at most {MAX_ID} characters", "",
                           param="item.id")
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise InvalidInput("item.content must be a non-empty list of parts", "", "", param="item.content")
    parts = []
    for i, part in enumerate(content):
        where = f"item.content[{i}]"
        if not isinstance(part, dict):
            raise InvalidInput(f"{where} must be an object", "", "", param=where)
        parts.append(_user_part(part, where, sources, limits) if role == "user" else
                     _other_part(part, role, where, wire))
    return Item(iid, role, parts)


def show_item(item: Item, wire: Wire) -> dict:
    """The item as the protocol shows it."""
    content = []
    for p in item.parts:
        if item.role != "assistant":
            kind = {"text": "input_text", "audio": "input_audio", "image": "input_image"}[p.kind]
            part = {"type": kind, "text": p.text} if p.kind == "text" else {"type": kind}
            if p.kind == "audio":
                part["transcript"] = p.text
        elif p.kind == "audio":
            part = {"type": wire.content_type("audio"), "transcript": p.text or ""}
        else:
            part = {"type": wire.content_type("text"), "text": p.text or ""}
        content.append(part)
    return {"id": item.id, "object": "realtime.item", "type": "message", "role": item.role, "status": item.status,
            "content": content}
