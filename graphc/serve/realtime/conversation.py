"""A session's conversation: its items in order, and the chat messages (with their media) a response is
generated from.

Items are messages: a user's text, audio (kept at 16 kHz, as the encoder hears it) and images, a system
message's text, an assistant's text or spoken answer (its transcript is what later turns see). A response
reads the newest items that fit the budget: at most MAX_ITEMS, and audio up to half of what a prompt of the
plan holds; older ones stay in the conversation but are not read.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphc.errors import InvalidInput
from graphc.runtime.media import AUDIO_RATE
from graphc.serve.realtime.audio import WIRE_RATE
from graphc.serving import Media

MAX_ITEMS = 64             # items a response reads at most
MAX_KEPT = 1024            # items a conversation keeps (the oldest go)


@dataclass
class Part:
    """One content part: kind 'text', 'audio' or 'image'; text (or an audio's transcript); audio at 16 kHz
    or a decoded image."""
    kind: str
    text: str | None = None
    media: Media | None = None
    spoken: int = 0               # an assistant's audio: the 24 kHz samples sent (truncate cuts it)

    @property
    def spoken_ms(self) -> int:
        return self.spoken * 1000 // WIRE_RATE


@dataclass
class Item:
    id: str
    role: str                     # user, assistant or system
    parts: list[Part] = field(default_factory=list)
    status: str = "completed"     # in_progress while a response speaks it; incomplete when cut short

    def audio_seconds(self) -> float:
        return sum(len(p.media.data) / AUDIO_RATE for p in self.parts if p.media is not None and p.kind == "audio")


class Conversation:
    def __init__(self):
        self.items: list[Item] = []

    def find(self, item_id: str, param: str = "item_id") -> Item:
        for item in self.items:
            if item.id == item_id:
                return item
        raise InvalidInput(f"no item '{item_id}' in the conversation", "", "name an item the server announced",
                           param=param)

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def add(self, item: Item, after: str | None = None) -> str | None:
        """Put `item` after the item `after` ('root': first; None: last); the id of the item before it."""
        if any(i.id == item.id for i in self.items):
            raise InvalidInput(f"item id '{item.id}' is in the conversation already", "", "give a new id or none",
                               param="item.id")
        at = len(self.items)
        if after == "root":
            at = 0
        elif after is not None:
            at = self.items.index(self.find(after, "previous_item_id")) + 1
        self.items.insert(at, item)
        if len(self.items) > MAX_KEPT:
            del self.items[0]
        return self.items[at - 1].id if at > 0 else None

    def delete(self, item_id: str) -> None:
        self.items.remove(self.find(item_id))


def messages(items: list[Item], instructions: str, audio_budget_s: float) -> tuple[list[dict], list[Media]]:
    """The chat messages (and their media, in order) of the newest items within the budget, after a system
    turn of `instructions` when there are any."""
    chosen, seconds = [], 0.0
    for item in reversed(items):
        seconds += item.audio_seconds()
        if len(chosen) >= MAX_ITEMS or (chosen and seconds > audio_budget_s):
            break
        chosen.append(item)
    out = [{"role": "system", "content": instructions}] if instructions else []
    media: list[Media] = []
    for item in reversed(chosen):
        if item.role != "user":
            text = "".join(p.text or "" for p in item.parts)
            out.append({"role": item.role, "content": text})
            continue
        parts = []
        for p in item.parts:
            if p.kind == "text":
                parts.append({"type": "text", "text": p.text or ""})
            else:
                parts.append({"type": p.kind})
                media.append(p.media)
        out.append({"role": "user", "content": parts})
    return out, media


def audio_item(item_id: str, samples: np.ndarray) -> Item:
    """A user's committed audio (16 kHz) as an item."""
    return Item(item_id, "user", [Part("audio", media=Media("audio", np.ascontiguousarray(samples, np.float32)))])
