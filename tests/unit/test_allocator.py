"""The caching-allocator model against hand-worked cases, one group per rule of c10's
CUDACachingAllocator.cpp (default settings):

  round_size        requests < 512 B become 512, others round up to a multiple of 512
  pool              rounded size <= 1 MiB: small pool, else large pool (kSmallSize)
  segment size      small: 2 MiB; large below 10 MiB: 20 MiB; 10 MiB and up: rounded up to 2 MiB
  best fit          the smallest free block of the pool that holds the request
  should_split      small pool: remainder >= 512 B; large pool: remainder > 1 MiB
  coalescing        a freed block merges with free neighbours of its own segment
  no release        segments are never given back

Every expected number below is worked out by hand from those rules (comments show the arithmetic),
and each test is built so that changing its rule changes an observable number: reserved bytes
(segments created), allocated bytes (block sizes handed out) or, for ties, the block taken.
"""
import pytest

from graphc.allocator import Allocator, round_size, segment_size

KiB, MiB = 1 << 10, 1 << 20


def alloc(*requests: int) -> Allocator:
    a = Allocator()
    for i, n in enumerate(requests):
        a.malloc(i, n)
    return a


# ---------------------------------------------------------------- rounding (kMinBlockSize = 512)

@pytest.mark.parametrize("request_, rounded", [
    (1, 512), (511, 512), (512, 512), (513, 1024), (1023, 1024), (1024, 1024), (1025, 1536),
    (3 * 512, 3 * 512), (MiB - 1, MiB), (MiB, MiB), (MiB + 1, MiB + 512), (10 * MiB + 1, 10 * MiB + 512),
])
def test_round_size(request_, rounded):
    assert round_size(request_) == rounded


def test_rounding_shows_in_allocated_bytes():
    # 511 -> 512, 512 -> 512, 513 -> 1024, 1024 -> 1024: 3072 B handed out, all in one 2 MiB segment
    a = alloc(511, 512, 513, 1024)
    assert a.allocated == 512 + 512 + 1024 + 1024 == 3072
    assert a.reserved == 2 * MiB


def test_a_2mib_small_segment_holds_exactly_4096_blocks_of_512():
    # 4096 x 512 B = 2 MiB exactly: the 4096th takes the last 512 B (remainder 0); one more is a new segment
    a = alloc(*[1] * 4096)
    assert (a.reserved, a.allocated) == (2 * MiB, 2 * MiB)
    a.malloc("one more", 1)
    assert a.reserved == 4 * MiB
    # 513 B rounds to 1024: only 2048 fit in a segment
    b = alloc(*[513] * 2048)
    assert b.reserved == 2 * MiB
    b.malloc("one more", 513)
    assert b.reserved == 4 * MiB


# ---------------------------------------------------------------- pool choice and segment sizes

@pytest.mark.parametrize("request_, segment", [
    (512, 2 * MiB), (MiB, 2 * MiB),                        # small pool: kSmallBuffer
    (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),       # 1-10 MiB: kLargeBuffer
    (10 * MiB, 10 * MiB),                                  # >= kMinLargeAlloc: rounded to 2 MiB
    (10 * MiB + 512, 12 * MiB), (12 * MiB, 12 * MiB), (12 * MiB + 512, 14 * MiB), (13 * MiB, 14 * MiB),
    (101 * MiB, 102 * MiB),
])
def test_segment_size(request_, segment):
    assert segment_size(request_) == segment


@pytest.mark.parametrize("request_, reserved", [
    (MiB - 1, 2 * MiB),          # rounds to 1 MiB: small pool
    (MiB, 2 * MiB),              # exactly kSmallSize is still small
    (MiB + 1, 20 * MiB),         # rounds to 1 MiB + 512: large pool, 20 MiB segment
    (10 * MiB - 512, 20 * MiB),  # the largest request below kMinLargeAlloc
    (10 * MiB, 10 * MiB),        # kMinLargeAlloc itself: its own segment, exactly its size
    (10 * MiB + 1, 12 * MiB),    # 10 MiB + 512 rounded up to 2 MiB
    (12 * MiB, 12 * MiB),
    (12 * MiB + 1, 14 * MiB),
])
def test_one_request_reserves_one_segment(request_, reserved):
    a = alloc(request_)
    assert a.reserved == reserved


def test_a_1mib_request_is_small_and_splits_its_2mib_segment():
    # small pool: 2 MiB segment, remainder 1 MiB >= 512 splits; the second 1 MiB takes the tail.
    # (In the large pool the remainder of 1 MiB would not split: 2 MiB handed out, a second segment.)
    a = alloc(MiB, MiB)
    assert (a.reserved, a.allocated) == (2 * MiB, 2 * MiB)


def test_the_tail_of_a_20mib_segment_serves_later_mid_requests():
    # 10 MiB - 512 in a 20 MiB segment leaves 10 MiB + 512 (> 1 MiB: split); a request of exactly
    # that size takes the tail; anything more needs a new segment
    a = alloc(10 * MiB - 512, 10 * MiB + 512)
    assert (a.reserved, a.allocated) == (20 * MiB, 20 * MiB)
    b = alloc(10 * MiB - 512, 10 * MiB + 1024)
    assert b.reserved == 20 * MiB + 12 * MiB


def test_a_rounded_large_segment_keeps_its_tail_for_later_requests():
    # 10 MiB + 1 -> 10 MiB + 512 in a 12 MiB segment; the tail 2 MiB - 512 (> 1 MiB) splits and
    # holds a 1 MiB + 1 request (-> 1 MiB + 512), whose remainder 1 MiB - 1 KiB is not split:
    # it takes the whole tail
    a = alloc(10 * MiB + 1)
    assert a.allocated == 10 * MiB + 512
    a.malloc("mid", MiB + 1)
    assert (a.reserved, a.allocated) == (12 * MiB, 12 * MiB)


def test_mid_requests_split_a_20mib_segment_and_reuse_it():
    a = alloc(8 * MiB, 8 * MiB)      # 8 + 8 of 20 MiB; the 4 MiB left is split off
    assert (a.reserved, a.allocated) == (20 * MiB, 16 * MiB)
    a.malloc("z", 8 * MiB)           # 4 MiB tail is too small: a new segment
    assert a.reserved == 40 * MiB


# ---------------------------------------------------------------- small-pool split: remainder >= 512

def test_small_pool_splits_a_remainder_of_exactly_512():
    # 2 MiB segment: 1 MiB, then 1 MiB - 512 leaves exactly 512 B, which is split off
    # and serves a 1-byte request: everything in one segment
    a = alloc(MiB, MiB - 512)
    assert a.allocated == 2 * MiB - 512
    a.malloc("tiny", 1)
    assert (a.reserved, a.allocated) == (2 * MiB, 2 * MiB)


def test_small_pool_remainder_of_zero_leaves_nothing_behind():
    a = alloc(MiB, MiB)              # the segment is exactly full
    assert (a.reserved, a.allocated) == (2 * MiB, 2 * MiB)
    a.malloc("tiny", 1)
    assert a.reserved == 4 * MiB


# ---------------------------------------------------------------- large-pool split: remainder > 1 MiB

def test_large_pool_does_not_split_a_remainder_of_exactly_1mib():
    # 19 MiB (>= 10 MiB) gets a 20 MiB segment; remainder 1 MiB is not > 1 MiB: the whole
    # 20 MiB block is handed out
    a = alloc(19 * MiB)
    assert (a.reserved, a.allocated) == (20 * MiB, 20 * MiB)


def test_large_pool_does_not_split_a_remainder_of_1mib_in_a_20mib_segment():
    # 4 MiB takes a 20 MiB segment (16 MiB tail split off); 15 MiB from the 16 MiB tail leaves
    # 1 MiB: not split, so the 15 MiB request holds 16 MiB and the segment is fully allocated
    a = alloc(4 * MiB)
    a.malloc("x", 15 * MiB)          # >= 10 MiB but best fit finds the 16 MiB tail first
    assert (a.reserved, a.allocated) == (20 * MiB, 20 * MiB)


def test_large_pool_splits_a_remainder_of_1mib_plus_512_and_reuses_it():
    # 19 MiB - 512 in a 20 MiB segment leaves 1 MiB + 512 (> 1 MiB): split off; a later
    # 1 MiB + 1 request (-> 1 MiB + 512) takes exactly that tail: no second segment
    a = alloc(19 * MiB - 512)
    assert a.allocated == 19 * MiB - 512
    a.malloc("tail", MiB + 1)
    assert (a.reserved, a.allocated) == (20 * MiB, 20 * MiB)


# ---------------------------------------------------------------- best fit

def test_best_fit_takes_the_smallest_free_block_that_holds_the_request():
    # free blocks: 30 MiB (older segment) and 20 MiB (newer one). A 16 MiB request takes the
    # 20 MiB block (best fit; a first-fit or largest-fit would take the 30 MiB one), so a
    # following 28 MiB request still finds the 30 MiB block: no new segment.
    a = alloc(30 * MiB, 20 * MiB)
    a.free(0)
    a.free(1)
    a.malloc("c", 16 * MiB)
    a.malloc("d", 28 * MiB)
    assert a.reserved == 50 * MiB
    # 16 MiB from 20 leaves 4 MiB (split); 28 MiB from 30 leaves 2 MiB (split)
    assert a.allocated == 44 * MiB


def test_best_fit_in_the_small_pool():
    # one 2 MiB segment: [a 512 KiB][b 1 KiB][c 256 KiB][d 1 KiB][tail 1278 KiB]; a and c freed.
    # 200 KiB takes c, the smaller block that holds it (first fit would take a, largest fit the tail);
    # 500 KiB then still fits in a, and a 1 MiB request still fits in the tail.
    a = alloc(512 * KiB, KiB, 256 * KiB, KiB)
    a.free(0)
    a.free(2)
    a.malloc("x", 200 * KiB)
    a.malloc("y", 500 * KiB)
    a.malloc("z", MiB)
    assert a.reserved == 2 * MiB


# ---------------------------------------------------------------- coalescing

def _three_blocks() -> Allocator:
    """One 24 MiB segment carved into [a 8][b 8][c 8] MiB (24 MiB freed first, then reused)."""
    a = Allocator()
    a.malloc("seg", 24 * MiB)
    a.free("seg")
    for k in "abc":
        a.malloc(k, 8 * MiB)
    assert (a.reserved, a.allocated) == (24 * MiB, 24 * MiB)
    return a


def test_a_freed_block_coalesces_with_the_previous_free_block():
    a = _three_blocks()
    a.free("a")
    a.free("b")                      # b's previous neighbour a is free: one 16 MiB block
    a.malloc("big", 16 * MiB)
    assert a.reserved == 24 * MiB


def test_a_freed_block_coalesces_with_the_next_free_block():
    a = _three_blocks()
    a.free("b")
    a.free("a")                      # a's next neighbour b is free: one 16 MiB block
    a.malloc("big", 16 * MiB)
    assert a.reserved == 24 * MiB


def test_a_freed_block_coalesces_with_both_neighbours():
    a = _three_blocks()
    a.free("a")
    a.free("c")
    a.free("b")                      # a + b + c: the whole 24 MiB segment again
    a.malloc("big", 24 * MiB)
    assert a.reserved == 24 * MiB


def test_without_a_free_neighbour_nothing_coalesces():
    a = _three_blocks()
    a.free("a")
    a.free("c")                      # two 8 MiB blocks with b live between them
    a.malloc("big", 16 * MiB)
    assert a.reserved == 24 * MiB + 16 * MiB


def test_blocks_of_different_segments_never_coalesce():
    a = alloc(12 * MiB, 12 * MiB)    # two 12 MiB segments, created one after the other
    a.free(0)
    a.free(1)
    a.malloc("big", 24 * MiB)        # no 24 MiB free block exists: a third segment
    assert a.reserved == 48 * MiB


def test_coalescing_in_the_small_pool():
    # [x 512 KiB][y 512 KiB][tail 1 MiB]: freeing both merges everything back into 2 MiB
    a = alloc(512 * KiB, 512 * KiB)
    a.free(1)                        # y merges with the free tail
    a.free(0)                        # x merges with y+tail
    a.malloc("whole", MiB)
    a.malloc("whole2", MiB)
    assert a.reserved == 2 * MiB


def test_free_blocks_coalesce_and_best_fit_reuses_them():
    a = Allocator()
    a.malloc("a", 64 * MiB)
    a.free("a")
    a.malloc("b", 30 * MiB)
    a.malloc("c", 30 * MiB)          # both carved from the freed 64 MiB segment
    assert a.reserved == 64 * MiB
    a.free("b")
    a.free("c")
    a.malloc("d", 64 * MiB)          # the halves coalesced back into one block
    assert a.reserved == 64 * MiB


# ---------------------------------------------------------------- small and large pools are separate

def test_a_small_request_never_uses_a_large_pool_block():
    a = alloc(4 * MiB)               # 20 MiB segment with a free 16 MiB tail
    a.malloc("small", 1)             # still gets its own 2 MiB segment
    assert a.reserved == 22 * MiB


def test_a_large_request_never_uses_a_small_pool_block():
    a = alloc(512)                   # 2 MiB small segment, almost all free
    a.free(0)                        # now entirely free
    a.malloc("large", MiB + 1)       # 1 MiB + 512 would fit in 2 MiB, but is large: a 20 MiB segment
    assert a.reserved == 22 * MiB


# ---------------------------------------------------------------- no release, keys

def test_segments_are_never_released():
    a = alloc(30 * MiB, 1000)
    a.free(0)
    a.free(1)
    assert (a.reserved, a.allocated) == (32 * MiB, 0)


def test_a_live_key_cannot_be_allocated_twice():
    a = alloc(100)
    with pytest.raises(KeyError):
        a.malloc(0, 100)


def test_replay_tags_keep_traces_apart():
    a = Allocator()
    trace = [(1, 0, 4 * MiB), (1, 1, 4 * MiB), (0, 0, 0), (0, 1, 0)]
    a.replay(trace, tag="g1")
    a.replay(trace, tag="g2")     # the second trace reuses the first one's freed blocks
    assert a.reserved == 20 * MiB and a.allocated == 0


def test_best_fit_ties_go_to_the_older_segment():
    # two free 12 MiB blocks of equal size, each a whole segment: c10 takes the lower address, which
    # the model stands for by segment order
    a = alloc(12 * MiB, 12 * MiB)
    a.free(0)
    a.free(1)
    a.malloc("c", 12 * MiB)
    assert a._live["c"].seg == 0 and a.reserved == 24 * MiB
