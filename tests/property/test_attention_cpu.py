"""The CPU attention backends against a float64 reference on random inputs and random layouts:
ragged (bidirectional, causal, sliding window, separate key segments) and paged (prefill over
several chunks, decode, mixed steps), plus the page allocator's query/act pairs."""
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from resources import PagedKVSpec, RaggedAttentionSpec
from resources.paged_kv import PageAllocator, PagedTorch, new_cache
from resources.ragged_attention import RaggedTorch
from tests.conftest import rel

SETTINGS = settings(max_examples=30, deadline=None)


def reference(q, k, v, causal=False, window=None):
    """One segment: q [Tq, Hq, D], k/v [Tk, Hkv, D] in float64; causal aligns q with the last keys."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    tq, tk = q.shape[0], k.shape[0]
    rows = torch.arange(tk - tq, tk)[:, None]
    cols = torch.arange(tk)[None, :]
    mask = torch.ones(tq, tk, dtype=torch.bool)
    if causal:
        mask &= cols <= rows
        if window is not None:
            mask &= cols > rows - window
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)



layouts = st.lists(st.integers(1, 24), min_size=1, max_size=5)
heads = st.sampled_from([(2, 2), (4, 2), (4, 1)])


@SETTINGS
@given(lens=layouts, hk=heads, causal=st.booleans(), window=st.one_of(st.none(), st.integers(1, 8)),
       seed=st.integers(0, 2**16))
def test_ragged_matches_float64(lens, hk, causal, window, seed):
    hq, hkv = hk
    window = window if causal else None
    spec = RaggedAttentionSpec(name="a", num_heads=hq, num_kv_heads=hkv, head_dim=8, max_segment=24,
                               causal=causal, window=window)
    g = torch.Generator().manual_seed(seed)
    t = sum(lens)
    q, k, v = torch.randn(t, hq, 8, generator=g), torch.randn(t, hkv, 8, generator=g), torch.randn(t, hkv, 8, generator=g)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    out = RaggedTorch(spec, cu)(q, k, v)
    for a, b in zip(cu, cu[1:]):
        assert rel(out[a:b], reference(q[a:b], k[a:b], v[a:b], causal, window)) < 1e-5


@SETTINGS
@given(pairs=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 10)), min_size=1, max_size=4),
       seed=st.integers(0, 2**16))
def test_ragged_with_longer_key_segments(pairs, seed):
    """Queries are the last rows of their key segment (an in-step cache), causal."""
    spec = RaggedAttentionSpec(name="a", num_heads=4, num_kv_heads=2, head_dim=8, max_segment=32, causal=True)
    g = torch.Generator().manual_seed(seed)
    qlens, klens = [q for q, _ in pairs], [q + extra for q, extra in pairs]
    q = torch.randn(sum(qlens), 4, 8, generator=g)
    k, v = torch.randn(sum(klens), 2, 8, generator=g), torch.randn(sum(klens), 2, 8, generator=g)
    cq, ck = [0], [0]
    for a, b in zip(qlens, klens):
        cq.append(cq[-1] + a)
        ck.append(ck[-1] + b)
    out = RaggedTorch(spec, cq, ck)(q, k, v)
    for i in range(len(pairs)):
        ref = reference(q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]], causal=True)
        assert rel(out[cq[i]:cq[i + 1]], ref) < 1e-5


@SETTINGS
@given(seqs=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=4), min_size=1, max_size=3),
       page=st.sampled_from([1, 4, 16]), seed=st.integers(0, 2**16))
def test_paged_prefill_in_chunks_then_decode_matches_float64(seqs, page, seed):
    """Each sequence's prompt arrives in chunks (several sequences share a step), then two decode
    steps for all of them; every step's output equals attention over the whole history."""
    spec = PagedKVSpec(name="kv", num_layers=2, num_qo_heads=4, num_kv_heads=2, head_dim=8, page_size=page,
                       max_seq_len=64, dtype="float32")
    g = torch.Generator().manual_seed(seed)
    pages = PageAllocator(256)
    cache = new_cache(spec, 256)
    history = {i: ([], []) for i in range(len(seqs))}       # all keys and values so far, per sequence
    tables = {i: [] for i in range(len(seqs))}
    steps = [[(i, c[j]) for i, c in enumerate(seqs) if j < len(c)] for j in range(max(map(len, seqs)))]
    steps += [[(i, 1) for i in range(len(seqs))]] * 2        # decode rows
    for step in steps:
        qo, kv, tabs, qs, ks, vs = [], [], [], [], [], []
        for i, n in step:
            total = sum(x.shape[0] for x in history[i][0]) + n
            need = spec.pages_for(total) - len(tables[i])
            assert pages.can_allocate(need)
            tables[i] += pages.allocate(need)
            q, k, v = (torch.randn(n, h, 8, generator=g) for h in (4, 2, 2))
            history[i][0].append(k)
            history[i][1].append(v)
            qo.append(n), kv.append(total), tabs.append(tables[i]), qs.append(q), ks.append(k), vs.append(v)
        out = PagedTorch(spec, cache, qo, kv, tabs)(1, torch.cat(qs), torch.cat(ks), torch.cat(vs))
        start = 0
        for (i, n), q in zip(step, qs):
            ref = reference(q, torch.cat(history[i][0]), torch.cat(history[i][1]), causal=True)
            assert rel(out[start:start + n], ref) < 1e-5
            start += n
