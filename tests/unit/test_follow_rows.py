"""graphc/runtime/follow_rows.py by hand: a buffer of 4 rows, pages of named rows stored, taken and evicted least
recently used first; a page larger than the buffer is not stored; a page is held only with every offset asked."""
import torch

from graphc.runtime.follow_rows import FollowRows


def row(v: float) -> torch.Tensor:
    return torch.full((3,), v)


def test_store_take_and_evict_by_hand():
    c = FollowRows(torch.zeros(4, 3))
    c.store(b"a", {0: row(1), 5: row(2)})
    c.store(b"b", {2: row(3)})
    assert c.holds(b"a", [0, 5]) and c.holds(b"a", [5]) and not c.holds(b"a", [0, 1]) and not c.holds(b"c", [0])
    got = c.take(b"a", [5, 0])                      # "a" is now the most recently used
    assert torch.equal(got[5], row(2)) and torch.equal(got[0], row(1))
    got[5].add_(1)                                  # a copy: the cache keeps its row
    assert torch.equal(c.take(b"a", [5])[5], row(2))
    c.store(b"c", {1: row(4), 2: row(5)})           # 3 rows held, 2 asked, 1 free: "b" (least recent) goes
    assert not c.holds(b"b", [2]) and c.holds(b"a", [0, 5]) and c.evicted == 1
    assert torch.equal(c.take(b"c", [2])[2], row(5))
    c.store(b"d", {o: row(o) for o in range(5)})    # more rows than the buffer: not stored, nothing evicted
    assert not c.holds(b"d", [0]) and c.evicted == 1
    c.store(b"a", {0: row(9), 5: row(9)})           # a page already held keeps its rows
    assert torch.equal(c.take(b"a", [0])[0], row(1))
    assert c.stats() == {"hit_rows": 0, "stored_rows": 4, "capacity_rows": 4, "pages": 2, "evicted_pages": 1}
