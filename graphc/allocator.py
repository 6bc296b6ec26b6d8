"""A model of PyTorch's CUDA caching allocator (default settings), to turn a sequence of tensor
allocations and frees into reserved bytes: rounding, small/large pools, segment sizes, best-fit
reuse, block splitting and coalescing, as in c10/cuda/CUDACachingAllocator.cpp.

One Allocator is one pool: the device's general pool, or the private pool that CUDA-graph
captures share. Segments are never released (no empty_cache between the modeled events).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20          # requests up to 1 MiB go to the small pool
SMALL_BUFFER = 2 << 20        # small-pool segments are 2 MiB
LARGE_BUFFER = 20 << 20       # requests of 1-10 MiB get 20 MiB segments
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20         # larger requests are rounded to 2 MiB


def round_size(size: int) -> int:
    return MIN_BLOCK if size < MIN_BLOCK else -(-size // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False)   # blocks are found by identity
class _Block:
    seg: int
    offset: int
    size: int
    free: bool = True


class Allocator:
    """Reserved and allocated bytes of one pool under the caching allocator's policy."""

    def __init__(self) -> None:
        self.reserved = 0
        self.allocated = 0
        self._segments: list[list[_Block]] = []
        self._seg_small: list[bool] = []
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # (size, seg, offset)
        self._live: dict[object, _Block] = {}

    def malloc(self, key: object, nbytes: int) -> None:
        if key in self._live:
            raise KeyError(f"allocation {key!r} is already live")
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        free = self._free[small]
        i = bisect.bisect_left(free, (size, -1, -1))          # best fit: smallest block that holds it
        if i < len(free):
            _, seg, off = free.pop(i)
            block = next(b for b in self._segments[seg] if b.offset == off)
        else:
            seg_bytes = segment_size(size)
            self.reserved += seg_bytes
            block = _Block(len(self._segments), 0, seg_bytes)
            self._segments.append([block])
            self._seg_small.append(small)
        block.free = False
        rest = block.size - size
        if (small and rest >= MIN_BLOCK) or (not small and rest > SMALL_SIZE):
            tail = _Block(block.seg, block.offset + size, rest)
            blocks = self._segments[block.seg]
            blocks.insert(blocks.index(block) + 1, tail)
            block.size = size
            bisect.insort(free, (tail.size, tail.seg, tail.offset))
        self._live[key] = block
        self.allocated += block.size

    def free(self, key: object) -> None:
        block = self._live.pop(key)
        self.allocated -= block.size
        block.free = True
        blocks = self._segments[block.seg]
        free = self._free[self._seg_small[block.seg]]
        i = blocks.index(block)
        if i + 1 < len(blocks) and blocks[i + 1].free:        # coalesce with the next block
            nxt = blocks.pop(i + 1)
            free.remove((nxt.size, nxt.seg, nxt.offset))
            block.size += nxt.size
        if i > 0 and blocks[i - 1].free:                      # and with the previous one
            prev = blocks[i - 1]
            free.remove((prev.size, prev.seg, prev.offset))
            prev.size += block.size
            blocks.pop(i)
            block = prev
        bisect.insort(free, (block.size, block.seg, block.offset))

    def replay(self, events: list[tuple[int, int, int]], tag: object = None) -> None:
        """Apply a trace of (is_alloc, key, nbytes) events; keys are made unique per tag."""
        for is_alloc, key, nbytes in events:
            if is_alloc:
                self.malloc((tag, key), nbytes)
            else:
                self.free((tag, key))
