"""The row caches on a GPU (graphc/runtime/follow_rows.py, media_cache.py): storing and taking rows makes no
host sync (torch's sync debug mode raises on one; a blocking copy would wait for the step in flight), and the
rows come back as stored. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from graphc.media_rows import RowPort
from graphc.runtime.follow_rows import FollowRows
from graphc.runtime.media_cache import MediaCache

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def strict():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.cuda.set_sync_debug_mode("error")
    yield
    torch.cuda.set_sync_debug_mode("default")


def test_follow_rows_store_and_take_without_a_sync():
    rows = {o: torch.full((64,), float(o), device="cuda", dtype=torch.bfloat16) for o in (1, 5, 9)}
    c = FollowRows(torch.zeros(8, 64, device="cuda", dtype=torch.bfloat16))
    c.store(b"page", rows)
    got = c.take(b"page", [9, 1])
    torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got[9], rows[9]) and torch.equal(got[1], rows[1])


def test_media_cache_store_without_a_sync():
    port = RowPort("embeds", 0, (64,), "bfloat16")
    cache = MediaCache("enc", [port], {"embeds": torch.zeros(16, 64, device="cuda", dtype=torch.bfloat16)})
    out = {"embeds": torch.arange(6 * 64, device="cuda", dtype=torch.bfloat16).view(6, 64)}
    cache._store(b"piece", out, 2, 3)
    torch.cuda.set_sync_debug_mode("default")
    index, _ = cache.entries[b"piece"]
    assert torch.equal(cache.buf["embeds"].index_select(0, index), out["embeds"][2:5])
