"""The scheduler against random arrival traces on the real single-GPU Qwen3-Omni plan's walks, budgets and
captured rungs, with a small page pool (so admission waits and decode preempts). A fake model samples
token 7 for every row. Checked at every step against the plan and brute force: the step fits its walk's
budget, each node replays the smallest captured rung that holds it (eager only above them all), chunks
start where their request stands and never cut a media piece, each piece is encoded once per prefill
pass, no page is held twice or lost; and every request finishes, leaving the pool full."""
from __future__ import annotations

import itertools
from functools import lru_cache

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphc.plan import load_plan
from graphc.runtime.boot import plan_ir
from graphc.serving import MediaItem, Piece, Prompt
from graphc.runtime.request import Request
from graphc.runtime.sampler import SamplingParams
from graphc.runtime.scheduler import Scheduler
from resources.paged_kv import PageAllocator

PLAN = "plans/qwen3_omni_h200.plan"
KINDS = {"t2t": (["thinker_prefill"], None), "a2t": (["audio_prefill"], ("audio_encoder", 104, 1)),
         "i2t": (["image_prefill"], ("vision_encoder", 1, 4))}


@lru_cache(maxsize=1)
def setting():
    plan = load_plan(PLAN)
    return plan, plan_ir(plan).model


def make_prompt(kind: str, text: int, items: int, size: int) -> Prompt:
    """text rows, then `items` media items of `size` windows (104 rows each) or of 4*size patches."""
    walk_node = {"a2t": ("audio_prefill", "audio_encoder"), "i2t": ("image_prefill", "vision_encoder")}
    ids, media = [1] * text, []
    for _ in range(items if kind != "t2t" else 0):
        walk, node = walk_node[kind]
        start = len(ids)
        if kind == "a2t":
            pieces = [Piece(1, 1, list(range(start + 104 * w, start + 104 * (w + 1)))) for w in range(size)]
            ids += [2] * 104 * size
        else:
            pieces = [Piece(4 * 64 * size, 1, list(range(start, start + 64 * size)))]
            ids += [3] * 64 * size
        ids += [1] * 3
        media.append(MediaItem(walk, node, "audio" if kind == "a2t" else "image", pieces))
    return Prompt(ids=ids, positions=torch.arange(len(ids))[None], delta=0, media=media)


request_spec = st.tuples(st.sampled_from(list(KINDS)), st.integers(1, 700), st.integers(1, 3), st.integers(1, 5),
                         st.integers(1, 40), st.integers(0, 6))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(request_spec, min_size=1, max_size=24), st.integers(60, 400))
def test_random_traces_fit_the_plan_and_leak_nothing(specs, pool):
    drive(specs, pool)


def test_decode_out_of_pages_preempts_and_every_request_still_finishes():
    s = drive([("t2t", 100, 1, 1, 200, i % 3) for i in range(10)], pool=80)
    assert s.stats.preemptions > 0


def drive(specs, pool) -> Scheduler:
    plan, model = setting()
    kv = model.resource("thinker_kv")
    pages = PageAllocator(pool)
    s = Scheduler(plan, model, "thinker", kv, pages, prefix_cache=False)     # the pool's own arithmetic
    ids = itertools.count()
    arrivals = sorted((at, i) for i, (*_, at) in enumerate(specs))
    pending = list(arrivals)
    reqs, encoded, step = [], {}, 0
    while pending or not s.idle():
        while pending and pending[0][0] <= step:
            _, i = pending.pop(0)
            kind, text, items, size, new, _ = specs[i]
            prefill, _ = KINDS[kind]
            prompt = make_prompt(kind, text, items, size)
            req = Request(id=f"r{i}", kind=kind, prefill_walks=prefill, decode_walk="thinker_decode", prompt=prompt,
                          params=SamplingParams(max_tokens=new), max_rows=len(prompt.ids) + new,
                          arrival=next(ids), max_tokens=new)
            if kv.pages_for(req.max_rows) > pool:
                continue                     # refused up front (scheduler.check); tested in tests/unit
            s.add(req)
            reqs.append(req)
        step += 1
        assert step < 20_000, "no progress"
        p = s.schedule()
        if p is None:
            assert s.idle() or not s.running
            continue
        walk = model.walk(p.walk)
        budget = walk.budget.axes()
        rows = sum(c.end - c.start for c in p.chunks)
        assert len(p.chunks) <= budget["seqs"]
        if walk.kind != "decode":
            assert rows <= budget["tokens"]
        else:
            assert all(c.end - c.start == 1 for c in p.chunks)
        for node, size in p.sizes.items():
            if size == 0:
                continue
            captured = plan.nodes[node].buckets[p.walk].captured
            want = min((r for r in captured if r >= size), default=None)
            assert p.rungs[node] == want
        units = sum(pc.units for c in p.chunks for pc in c.pieces)
        enc = [n for n in walk.path if n != "thinker"]
        if enc:
            axis = plan.nodes[enc[0]].buckets[p.walk].axis
            assert units == p.sizes.get(enc[0], 0) <= budget[axis]
        held = [pg for r in s.running for pg in r.pages]
        assert len(held) == len(set(held)) and len(held) + pages.num_free == pool
        for c in p.chunks:
            assert c.start == c.req.computed and c.req in s.running
            assert len(c.req.pages) >= kv.pages_for(c.end)
            for m in c.req.prompt.media:
                for pc in m.pieces:
                    inside = [c.start <= r < c.end for r in pc.rows]
                    assert all(inside) or not any(inside), "a chunk cuts a media piece"
                    assert any(inside) == any(pc is q for q in c.pieces)
                    if any(inside):
                        key = (c.req.id, c.req.preemptions, id(pc))
                        assert key not in encoded
                        encoded[key] = True
        for c in p.chunks:                      # what the engine does with the step's results
            c.req.computed = c.end
        for c in p.chunks:
            if c.sample:
                c.req.output.append(7)
                if len(c.req.output) >= c.req.max_tokens:
                    c.req.finish_reason = "length"
                    s.release(c.req)
    assert all(r.finish_reason == "length" and len(r.output) == r.max_tokens for r in reqs)
    assert s.idle() and s.pool_full() and pages.num_free == pool
    return s
