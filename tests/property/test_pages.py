"""PageAllocator (resources/paged_kv.py) against a trivial model: the set of free page ids.

Every request size is drawn relative to the current free count (exactly all of it, one more,
one less, zero, ...), so the boundaries of can_allocate are reached in every run, not by luck.
"""
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from resources.paged_kv import PageAllocator

# an operation: ("alloc", offset from the free count) or ("free", which held list)
ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from([0, 1, -1, 2, -2])),   # n = free + offset
    st.tuples(st.just("alloc"), st.integers(-40, 0).map(lambda d: d - 3)),  # well below: n = free + d
    st.tuples(st.just("zero"), st.just(0)),
    st.tuples(st.just("free"), st.integers(0, 100)),
), max_size=40)


def check_against_model(num_pages: int, script: list[tuple[str, int]]) -> None:
    pages = PageAllocator(num_pages)
    free = set(range(num_pages))          # the model: page ids nobody holds
    held: list[list[int]] = []
    for op, arg in script:
        if op == "free":
            if held:
                out = held.pop(arg % len(held))
                pages.free(out)
                free |= set(out)
        else:
            n = 0 if op == "zero" else len(free) + arg
            expect = 0 <= n <= len(free)
            assert pages.can_allocate(n) is expect, (n, len(free))
            if expect:
                got = pages.allocate(n)
                assert len(got) == n and len(set(got)) == n      # n distinct pages ...
                assert set(got) <= free                          # ... all of them free until now
                free -= set(got)
                held.append(got)
            elif n >= 0:
                with pytest.raises(RuntimeError):
                    pages.allocate(n)
        assert pages.num_free == len(free)
    # what is left can be taken exactly, and is exactly the model's free set
    assert pages.can_allocate(len(free)) and not pages.can_allocate(len(free) + 1)
    rest = pages.allocate(len(free))
    assert sorted(rest) == sorted(free)
    assert pages.num_free == 0 and pages.can_allocate(0) and not pages.can_allocate(1)


@settings(max_examples=150, deadline=None)
@given(num_pages=st.integers(0, 40), script=ops)
@example(num_pages=8, script=[("alloc", 0)])                            # exactly full
@example(num_pages=8, script=[("alloc", 1)])                            # one page short
@example(num_pages=8, script=[("alloc", -1), ("alloc", 1), ("alloc", 0)])   # full but one, then 2, then 1
@example(num_pages=0, script=[("zero", 0), ("alloc", 1)])               # an empty pool
@example(num_pages=5, script=[("alloc", 0), ("zero", 0), ("free", 0), ("alloc", 0)])   # freed, re-used
def test_page_allocator_matches_a_set_of_free_pages(num_pages, script):
    check_against_model(num_pages, script)


@pytest.mark.parametrize("num_pages", [1, 2, 7, 64])
def test_boundaries_of_a_fresh_pool(num_pages):
    pages = PageAllocator(num_pages)
    assert pages.num_free == num_pages
    assert pages.can_allocate(0) and pages.can_allocate(num_pages)
    assert not pages.can_allocate(num_pages + 1) and not pages.can_allocate(-1)
    with pytest.raises(RuntimeError):
        pages.allocate(num_pages + 1)
    assert pages.allocate(0) == [] and pages.num_free == num_pages
    got = pages.allocate(num_pages)                   # the pool exactly full
    assert sorted(got) == list(range(num_pages))      # every page, in range, once
    assert not pages.can_allocate(1) and pages.can_allocate(0)
    with pytest.raises(RuntimeError):
        pages.allocate(1)
    pages.free(got[:1])                               # one page back: exactly one can be taken again
    assert pages.can_allocate(1) and not pages.can_allocate(2)
    assert pages.allocate(1) == got[:1]


def test_freed_pages_are_reused_before_the_pool_runs_out():
    pages = PageAllocator(4)
    for _ in range(10):                               # 10 rounds of 3 pages from a pool of 4
        got = pages.allocate(3)
        assert len(set(got)) == 3 and set(got) <= {0, 1, 2, 3}
        pages.free(got)
    assert pages.num_free == 4
