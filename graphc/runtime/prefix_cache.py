"""KV pages shared across requests by content (prefix caching), over the plan's page pool: no new memory.

A full page of a request's rows is keyed by its chain: key_i = blake2b(key_{i-1} + the page's token ids + the
content of the media pieces with rows in it, each with its first row), so a key names every row before it
too. A media piece is named by its encoder input (digest(): the host's preprocessed patches or features),
where its request is prepared (media_digests, in the server's worker threads).
When a request ends or is preempted, its full pages of computed rows are registered under their keys; a page
no request holds stays cached, idle, until the pool needs it: allocation takes free pages first, then the
least recently used idle ones. A new request takes the longest run of cached pages matching its prompt's
first pages (never its last prompt row: a step must compute it to sample), holds them with the other
requests that match them, and its prefill starts after them. A shared page is full and never written again:
new rows go to the request's own pages.

A cached run of pages never ends inside a media piece (its encoder step runs whole). Not cached: a piece
whose input digest() cannot name (and every row from it on), and plans with linear-attention state (a
sequence's state would need a snapshot at each cached boundary). A speaking request takes a cached page only
where the follow cache holds the page's rows its follow stage reads (graphc/runtime/follow_rows.py; the
scheduler's lookup). SharedPages has PageAllocator's interface;
num_free counts the idle cached pages, which any allocation may take.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from array import array
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from resources.paged_kv import PageAllocator


def chain_keys(ids: list[int], page_size: int, rows: int, media=None) -> list[bytes]:
    """The keys of the full pages within the first `rows` of ids. media(i): bytes naming the media content of
    page i's rows (b"" for text rows), or None where it cannot be named: the chain stops before that page."""
    keys, key = [], b""
    for i, start in enumerate(range(0, rows - page_size + 1, page_size)):
        extra = media(i) if media is not None else b""
        if extra is None:
            break
        key = hashlib.blake2b(key + array("q", ids[start:start + page_size]).tobytes() + extra,
                              digest_size=16).digest()
        keys.append(key)
    return keys


def digest(data) -> bytes | None:
    """A media piece's encoder input named by its content (tensors and arrays by dtype, shape and bytes,
    dataclasses by their fields), 16 bytes of its SHA-256 (on x86 with SHA extensions about twice blake2b's
    speed over a clip's patches); None for a value it cannot name."""
    h = hashlib.sha256()
    return h.digest()[:16] if _feed(h, data) else None


_POOL: ThreadPoolExecutor | None = None


def piece_key(req, piece) -> bytes | None:
    """A request's media piece named by its content: Request.media_keys, filled where the request was prepared
    (media_digests), or computed here once for a request that was not."""
    if id(piece) not in req.media_keys:
        req.media_keys[id(piece)] = digest(piece.data)
    return req.media_keys[id(piece)]


def media_digests(prompt) -> dict:
    """digest() of every media piece of a prompt, id(piece) -> digest (Request.media_keys), the pieces hashed in
    parallel (hashlib leaves the GIL for large buffers): a 30 s clip's 160 MB of patches in a fraction of the
    one-thread time. Called where the request is prepared, so that the engine's thread never hashes."""
    global _POOL
    pieces = [p for m in prompt.media for p in m.pieces]
    if len(pieces) < 2:
        return {id(p): digest(p.data) for p in pieces}
    if _POOL is None:
        _POOL = ThreadPoolExecutor(min(8, os.cpu_count() or 1), thread_name_prefix="graphc-digest")
    return dict(zip(map(id, pieces), _POOL.map(digest, [p.data for p in pieces])))


def _feed(h, x) -> bool:
    import numpy as np
    import torch

    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().data if t.numel() else b"")
        return True
    if isinstance(x, np.ndarray):
        h.update(f"{x.dtype}{x.shape}".encode())
        h.update(np.ascontiguousarray(x).data)
        return True
    if isinstance(x, (int, float, str, bool)) or x is None:
        h.update(repr(x).encode())
        return True
    if isinstance(x, (list, tuple)):
        h.update(f"{type(x).__name__}{len(x)}".encode())
        return all(_feed(h, y) for y in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        h.update(type(x).__name__.encode())
        return all(_feed(h, getattr(x, f.name)) for f in dataclasses.fields(x))
    return False


class SharedPages:
    """A PageAllocator whose full text pages may be cached and shared (the module's docstring)."""

    def __init__(self, pages: PageAllocator, page_size: int):
        self.pages, self.page_size = pages, page_size
        self.num_pages = pages.num_pages
        self.by_key: dict[bytes, int] = {}
        self.key_of: dict[int, bytes] = {}
        self.refs: dict[int, int] = {}                      # cached page -> the requests holding it
        self.idle: OrderedDict[int, None] = OrderedDict()  # cached pages nobody holds, least recently used first
        self.hit_rows = 0                                   # prompt rows taken from the cache, since boot
        self.query_rows = 0                                 # rows admitted requests looked up (their targets)
        self.evicted = 0

    @property
    def num_free(self) -> int:
        return self.pages.num_free + len(self.idle)

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= self.num_free

    def allocate(self, n: int) -> list[int]:
        """n pages: free ones first, then idle cached ones, least recently used first (their keys dropped)."""
        if not self.can_allocate(n):
            raise RuntimeError(f"asked for {n} pages with {self.num_free} free; call can_allocate first")
        fresh = min(n, self.pages.num_free)
        out = self.pages.allocate(fresh)
        for _ in range(n - fresh):
            page, _ = self.idle.popitem(last=False)
            del self.by_key[self.key_of.pop(page)], self.refs[page]
            self.evicted += 1
            out.append(page)
        return out

    def free(self, pages: list[int]) -> None:
        """Give pages back: a cached one goes idle when its last holder lets go, the others to the free list."""
        plain = [p for p in pages if p not in self.key_of]
        self.pages.free(plain)
        for p in pages:
            if p in self.key_of:
                self.refs[p] -= 1
                if self.refs[p] == 0:
                    self.idle[p] = None            # most recently used last

    def matched(self, keys: list[bytes]) -> int:
        """How many of keys, from the first, are cached now (nothing is taken)."""
        n = 0
        while n < len(keys) and keys[n] in self.by_key:
            n += 1
        return n

    def share(self, keys: list[bytes]) -> list[int]:
        """The cached pages of the longest run of keys from the first, each now held once more."""
        out = []
        for key in keys:
            page = self.by_key.get(key)
            if page is None:
                break
            self.refs[page] += 1
            self.idle.pop(page, None)
            out.append(page)
        return out

    def register(self, pages: list[int], keys: list[bytes]) -> None:
        """Cache a request's full pages under their keys (a page already cached, or a key cached on another
        page, is left as it is); the request still holds them."""
        for page, key in zip(pages, keys):
            if page in self.key_of or key in self.by_key:
                continue
            self.by_key[key], self.key_of[page], self.refs[page] = page, key, 1
