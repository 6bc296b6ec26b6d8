"""SharedPages and chain_keys (graphc/runtime/prefix_cache.py) on hand-worked cases: a key names its page's
tokens and every row before them; allocation takes free pages before idle cached ones, and those least
recently used first; a cached page goes idle only when its last holder lets go; a key or page cached twice is
left as it was."""
from graphc.runtime.prefix_cache import SharedPages, chain_keys
from resources.paged_kv import PageAllocator


def test_a_key_names_the_page_and_every_row_before_it():
    a = chain_keys([1, 2, 3, 4, 5, 6, 7], 2, 7)
    assert len(a) == 3                                         # the 7th row's page is not full
    assert chain_keys([1, 2, 3, 4], 2, 4) == a[:2]
    b = chain_keys([9, 9, 3, 4], 2, 4)
    assert b[0] != a[0] and b[1] != a[1]                       # the same tokens after another page differ
    assert chain_keys([1, 2, 3, 4, 5, 6, 7], 2, 5) == a[:2]    # only the first `rows` rows count


def test_free_pages_go_first_then_idle_ones_least_recently_used_first():
    sp = SharedPages(PageAllocator(4), 2)
    held = sp.allocate(3)
    keys = chain_keys([1, 2, 3, 4, 5, 6], 2, 6)
    sp.register(held, keys)
    sp.free([held[2]])
    sp.free([held[0], held[1]])                                # idle now: held[2], then held[0], held[1]
    assert sp.num_free == 4 and list(sp.idle) == [held[2], held[0], held[1]]
    first = sp.allocate(1)
    assert first not in held                                   # the one page never cached
    assert sp.allocate(2) == [held[2], held[0]] and sp.evicted == 2
    assert sp.share(keys) == []                                # the chain's first page is gone
    assert sp.share(keys[1:]) == [held[1]] and not sp.idle     # held again: not idle


def test_a_cached_page_goes_idle_when_its_last_holder_lets_go():
    sp = SharedPages(PageAllocator(3), 2)
    pages = sp.allocate(2)
    keys = chain_keys([5, 6, 7, 8], 2, 4)
    sp.register(pages, keys)
    assert sp.share(keys) == pages and sp.refs[pages[0]] == 2
    sp.free(pages)
    assert not sp.idle and sp.num_free == 1
    sp.free(pages)
    assert list(sp.idle) == pages and sp.num_free == 3


def test_a_key_or_page_cached_twice_is_left_as_it_was():
    sp = SharedPages(PageAllocator(4), 2)
    a, b = sp.allocate(1), sp.allocate(1)
    key = chain_keys([1, 2], 2, 2)
    sp.register(a, key)
    sp.register(b, key)                                        # the same rows computed twice: b stays plain
    assert sp.by_key[key[0]] == a[0] and b[0] not in sp.key_of
    sp.free(b)
    assert sp.pages.num_free == 3 and not sp.idle


def test_a_digest_names_content_dtype_and_shape_and_refuses_what_it_cannot_read():
    import dataclasses

    import numpy as np
    import torch

    from graphc.runtime.prefix_cache import digest

    x = torch.arange(12, dtype=torch.float32).view(3, 4)
    assert digest(x) == digest(x.clone()) and digest(x) == digest(x.t().contiguous().t())
    assert digest(x) != digest(x.view(4, 3)) and digest(x) != digest(x.to(torch.float64))
    y = x.clone()
    y[2, 3] += 1
    assert digest(x) != digest(y)
    assert digest(x.to(torch.bfloat16)) is not None and digest(np.zeros(3)) != digest(np.zeros(4))

    @dataclasses.dataclass
    class Item:
        patches: torch.Tensor
        grid: tuple

    assert digest(Item(x, (1, 3, 4))) != digest(Item(x, (1, 4, 3)))
    assert digest(object()) is None and digest([x, object()]) is None
