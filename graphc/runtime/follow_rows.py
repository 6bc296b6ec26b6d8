"""The LLM's output rows a follow stage reads, kept for the prefix cache's pages: the plan's line
`media_cache.<llm>` on the LLM's device (graphc/media_rows.py sizes it; allocated by media_cache.allocate_caches).

A speaking request's follow prompt reads the LLM's output (the pipeline's follow.reads) at the prompt rows its
host names (Speech.hidden_rows: say an LLM's hidden rows of a user turn's media). A
page taken from the prefix cache is not computed again, so those rows of it come from here: when a speaking
request's full pages are registered with the prefix cache, the named rows of each are copied in under the page's
chain key (which names every row up to the page's end, so they are the rows any request matching the page would
compute). A speaking request takes cached pages up to the first one with a named row this cache does not hold,
and those rows are copied out to the request. Pages are evicted least recently used first; a page with more
named rows than the cache holds is not stored.
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from graphc.runtime.sampler import on_device


class FollowRows:
    """One LLM's cache of follow-read rows by prefix page (the module's docstring)."""

    def __init__(self, buffer: torch.Tensor):
        self.buf = buffer                                   # [rows, *a row's shape] on the LLM's device
        self.capacity = buffer.shape[0]
        self.free = list(range(self.capacity))
        # page chain key -> {row within the page: buffer row}, least recently used first
        self.entries: OrderedDict[bytes, dict[int, int]] = OrderedDict()
        self.hit_rows = self.evicted = 0           # hit_rows: rows admitted requests took (the scheduler counts)

    def stats(self) -> dict:
        return {"hit_rows": self.hit_rows, "stored_rows": self.capacity - len(self.free),
                "capacity_rows": self.capacity, "pages": len(self.entries), "evicted_pages": self.evicted}

    def holds(self, key: bytes, offsets: list[int]) -> bool:
        """Whether the rows at these offsets of the page keyed `key` are held."""
        held = self.entries.get(key)
        return held is not None and all(o in held for o in offsets)

    def take(self, key: bytes, offsets: list[int]) -> dict[int, torch.Tensor]:
        """Copies of the held rows at these offsets of a page (holds() first), the page now most recently used."""
        held = self.entries[key]
        self.entries.move_to_end(key)
        rows = self.buf.index_select(0, on_device([held[o] for o in offsets], torch.int64, self.buf.device))
        return dict(zip(offsets, rows))

    def store(self, key: bytes, rows: dict[int, torch.Tensor]) -> None:
        """Copy in a page's named rows {offset: row}, evicting least recently used pages for room."""
        if not rows or key in self.entries or len(rows) > self.capacity:
            return
        while len(self.free) < len(rows):
            _, gone = self.entries.popitem(last=False)
            self.free += gone.values()
            self.evicted += 1
        taken, self.free = self.free[:len(rows)], self.free[len(rows):]
        index = on_device(taken, torch.int64, self.buf.device)   # async: no wait for the step in flight
        self.buf.index_copy_(0, index, torch.stack(list(rows.values())).to(self.buf.dtype))
        self.entries[key] = dict(zip(rows, taken))


def follow_rows(boot, llm: str) -> FollowRows | None:
    """The LLM's cache where this device holds its line with room (one port: the follow stage reads one)."""
    bufs = boot.media.get(llm)
    if not bufs:
        return None
    (buf,) = bufs.values()
    return FollowRows(buf) if buf.shape[0] else None
