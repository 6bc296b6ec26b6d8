from graphc.allocator import LARGE_BUFFER, SMALL_BUFFER, Allocator, round_size, segment_size

MiB = 1 << 20


def test_rounding_and_segment_sizes():
    assert round_size(1) == 512 and round_size(513) == 1024
    assert segment_size(1 * MiB) == SMALL_BUFFER
    assert segment_size(1 * MiB + 512) == LARGE_BUFFER
    assert segment_size(10 * MiB) == 10 * MiB
    assert segment_size(11 * MiB + 1) == 12 * MiB


def test_small_requests_share_a_2mib_segment():
    a = Allocator()
    for i in range(4):
        a.malloc(i, 1000)
    assert a.reserved == SMALL_BUFFER and a.allocated == 4 * 1024


def test_mid_requests_split_a_20mib_segment_and_reuse_it():
    a = Allocator()
    a.malloc("x", 8 * MiB)
    a.malloc("y", 8 * MiB)        # fits in the 12 MiB tail of the first segment
    assert a.reserved == LARGE_BUFFER
    a.malloc("z", 8 * MiB)        # 4 MiB tail is too small: a new segment
    assert a.reserved == 2 * LARGE_BUFFER


def test_free_blocks_coalesce_and_best_fit_reuses_them():
    a = Allocator()
    a.malloc("a", 64 * MiB)
    a.free("a")
    a.malloc("b", 30 * MiB)
    a.malloc("c", 30 * MiB)       # both carved from the freed 64 MiB segment
    assert a.reserved == 64 * MiB
    a.free("b")
    a.free("c")
    a.malloc("d", 64 * MiB)       # the halves coalesced back into one block
    assert a.reserved == 64 * MiB


def test_replay_tags_keep_traces_apart():
    a = Allocator()
    trace = [(1, 0, 4 * MiB), (1, 1, 4 * MiB), (0, 0, 0), (0, 1, 0)]
    a.replay(trace, tag="g1")
    a.replay(trace, tag="g2")     # the second trace reuses the first one's freed blocks
    assert a.reserved == LARGE_BUFFER and a.allocated == 0
