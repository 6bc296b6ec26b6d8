"""Prefix caching (graphc/runtime/prefix_cache.py) on a tiny Qwen3-Omni thinker written by transformers (its
weights re-drawn): a request whose first rows were computed before reuses those pages, and every greedy answer
equals the same requests on an engine without the cache (test_engine.py holds that engine to HF). Hand-worked
cases: a repeated prompt (every full page but the one holding its last row), a conversation's second turn (the
first turn's prompt and answer), a shared system prompt, an image named by its content (the same image again
reuses its rows; another of the same size does not), a cached run that would end inside an image stopping
before it, the pool's least recently used idle pages evicted first, and an idle engine's pool all free again
(the leak oracle)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from graphc import Media
from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams
from tests.unit.loopback import tiny_omni

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    return tiny_omni(tmp_path_factory.mktemp("prefix"), speech=True)      # speech=True: weights re-drawn


@pytest.fixture(scope="module")
def engines(omni):
    return Engine(omni / "p.plan", omni / "ckpt"), Engine(omni / "p.plan", omni / "ckpt", prefix_cache=False)


def run(engine, prompts: list[list[int]], media=None) -> list[list[int]]:
    reqs = [engine.add(prompt_token_ids=p, params=GREEDY, media=media or []) for p in prompts]
    while engine.has_work():
        engine.step()
    return [list(r.output) for r in reqs]


def ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(10, 300, n).tolist()


def hits(engine) -> int:
    return engine.stats()["prefix_cache"]["hit_rows"]


def test_a_repeated_prompt_reuses_every_full_page_but_its_last_rows(engines, leak_oracle):
    cached, plain = engines
    leak_oracle.watch(cached)
    ps = cached.executor.kv_spec.page_size
    prompt = ids(1, 3 * ps + 5)
    first = run(cached, [prompt])
    before = hits(cached)
    again = run(cached, [prompt])
    assert hits(cached) - before == 3 * ps                   # rows 0..3ps-1; the 4th page holds the last row
    assert first == again == run(plain, [prompt])


def test_a_second_turn_reuses_the_first_turns_prompt_and_answer(engines, leak_oracle):
    cached, plain = engines
    leak_oracle.watch(cached)
    ps = cached.executor.kv_spec.page_size
    turn1 = ids(2, 2 * ps + 3)
    answer = run(cached, [turn1])[0]
    turn2 = turn1 + answer + ids(3, ps)
    before = hits(cached)
    got = run(cached, [turn2])
    computed = len(turn1) + len(answer) - 1                  # the last answer token was never fed
    assert hits(cached) - before == computed // ps * ps
    assert got == run(plain, [turn2])


def test_requests_sharing_a_system_prompt_share_its_pages(engines, leak_oracle):
    cached, plain = engines
    leak_oracle.watch(cached)
    ps = cached.executor.kv_spec.page_size
    system = ids(4, 2 * ps)
    run(cached, [system + ids(5, 7)])
    before = hits(cached)
    prompts = [system + ids(6 + i, 3 + i) for i in range(3)]
    got = run(cached, prompts)
    assert hits(cached) - before == 3 * 2 * ps
    assert got == run(plain, prompts)


def test_an_image_is_named_by_its_content(engines, leak_oracle):
    """The same image again: every full page up to the prompt's last row, the image's rows among them. Another
    image of the same size (the same ids): only the text page before it."""
    cached, plain = engines
    leak_oracle.watch(cached)
    ps = cached.executor.kv_spec.page_size
    gen = np.random.default_rng(0)
    image, other = (torch.from_numpy(gen.integers(0, 256, (3, 40, 56), np.uint8)) for _ in range(2))
    prompt = ids(7, ps + 3) + [cached.host.token_of["image"]] + ids(8, 2 * ps)
    first = run(cached, [prompt], [Media("image", image)])
    before = hits(cached)
    req = cached.add(prompt_token_ids=prompt, params=GREEDY, media=[Media("image", image)])
    rows = len(req.prompt.ids)
    (piece,) = [p for m in req.prompt.media for p in m.pieces]
    while cached.has_work():
        cached.step()
    assert piece.last < (rows - 1) // ps * ps                      # the image lies within the cached pages
    assert hits(cached) - before == (rows - 1) // ps * ps
    assert first == [list(req.output)] == run(plain, [prompt], [Media("image", image)])
    before = hits(cached)
    assert run(cached, [prompt], [Media("image", other)]) == run(plain, [prompt], [Media("image", other)])
    assert hits(cached) - before == ps                             # rows 0..ps-1: text before the image


def test_a_cached_run_never_ends_inside_a_media_piece(engines):
    """A prompt that ends a few rows after its image: the page boundary below its last row falls inside the
    image's rows, so the cached run stops at the page boundary below the image's first row."""
    cached, plain = engines
    ps = cached.executor.kv_spec.page_size
    image = torch.from_numpy(np.random.default_rng(5).integers(0, 256, (3, 160, 200), np.uint8))
    prompt = ids(9, ps + 3) + [cached.host.token_of["image"]] + ids(10, 2)
    run(cached, [prompt], [Media("image", image)])
    req = cached.add(prompt_token_ids=prompt, params=GREEDY, media=[Media("image", image)])
    (piece,) = [p for m in req.prompt.media for p in m.pieces]
    inside = (len(req.prompt.ids) - 1) // ps * ps
    before = hits(cached)
    while cached.has_work():
        cached.step()
    assert piece.first < inside <= piece.last, (piece.first, piece.last, inside)       # the case at hand
    assert hits(cached) - before == piece.first // ps * ps
    assert [list(req.output)] == run(plain, [prompt], [Media("image", image)])


def test_idle_pages_are_evicted_least_recently_used_first(engines):
    cached, _ = engines
    pages, sh = cached.scheduler.pages, cached.scheduler.shared
    ps = cached.executor.kv_spec.page_size
    old, new = ids(20, 2 * ps + 1), ids(21, 2 * ps + 1)
    run(cached, [old])
    run(cached, [new])                          # its two full pages are now the most recently used
    taken = pages.allocate(sh.pages.num_free)   # a full pool: what comes next is taken from the idle pages
    order = list(sh.idle)
    evicted = pages.allocate(len(order) - 2)
    assert evicted == order[:-2] and len(sh.idle) == 2
    pages.free(taken + evicted)
    before = hits(cached)
    run(cached, [new])
    assert hits(cached) - before == 2 * ps                     # the newer prompt's pages survived
    before = hits(cached)
    run(cached, [old])
    assert hits(cached) == before                              # the older one's were evicted


def test_graphc_run_caches_unless_told_not_to(tmp_path, monkeypatch):
    import json

    from graphc.cli import main
    from tests.conftest import ROOT

    monkeypatch.chdir(ROOT)                 # the plan names its model file from the repo's root
    reqs = tmp_path / "r.jsonl"
    reqs.write_text(json.dumps({"prompt_token_ids": list(range(1, 40)), "max_tokens": 2}) + "\n")
    for flag, cached in (([], True), (["--no-prefix-cache"], False)):
        stats = tmp_path / "s.json"
        assert main(["run", str(ROOT / "plans" / "tiny_cpu.plan"), "--random-weights", "--requests", str(reqs),
                     "--output", str(tmp_path / "o.jsonl"), "--stats", str(stats)] + flag) == 0
        assert ("prefix_cache" in json.loads(stats.read_text())) == cached


def test_a_second_turn_goes_to_the_replica_that_cached_the_first(omni, engines):
    """Two replicas (graphc/runtime/replicas.py): a busier replica that has a free decode slot and holds the
    first turn's pages takes the second turn, where slots and pages alone would send it to the other."""
    from graphc.cli import main
    from graphc.runtime.replicas import Replicas

    plan = omni / "p2.plan"
    assert main(["plan", "models/qwen3_omni.py", "--preset", "tiny", "--checkpoint", str(omni / "ckpt"), "--gpu",
                 "cpu", "--gpus", "2", "--replicas", "2", "-o", str(plan), "-q"]) == 0
    two = Replicas(plan, omni / "ckpt")
    ps = two.engines[0].executor.kv_spec.page_size
    turn1 = ids(30, 2 * ps + 3)
    (first,) = two.generate([{"prompt_token_ids": turn1, "max_tokens": 6, "temperature": 0, "ignore_eos": True}])
    turn2 = turn1 + first.token_ids + ids(31, 5)
    items = [{"prompt_token_ids": p, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
             for p in (ids(32, 9), turn2)]         # the first takes replica 0 (a tie): it is the busier one
    outs = two.generate(items)
    hit = [e.stats()["prefix_cache"]["hit_rows"] for e in two.engines]
    assert hit == [(len(turn1) + 5) // ps * ps, 0], hit
    assert outs[1].token_ids == run(engines[1], [turn2])[0]
