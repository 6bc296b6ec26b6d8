"""Replicas: how --gpus N is laid out (one copy over the devices, or a replica on each) and where the
runtime sends a request. Expected layouts come from planning each layout alone (--replicas forced) and
working the rule of graphc/passes/choose_layout.py's docstring by hand on those plans' pages."""
from __future__ import annotations

import pytest

from graphc.cli import main
from graphc.errors import DoesNotFit, InvalidInput
from graphc.passes.choose_layout import Layout, candidates, choose
from graphc.pipeline import compile_model
from graphc.plan import load_plan
from graphc.runtime.replicas import pick
from graphc.source import load_model
from graphc.units import GiB
from tests.conftest import ROOT, TINY

SMALL = load_model(TINY, "small")


def at_once(plan) -> float:
    """The docstring's rule, by hand on a plan: replicas x min(pages / min_pages, decode seqs) over its pools."""
    seqs = max(w.budget["seqs"] for w in plan.walks.values() if w.kind == "decode")
    held = min(p / r.min_pages for r in plan.resources.values() if r.pages for p in r.pages.values())
    return plan.replicas * min(held, seqs)


@pytest.mark.parametrize("cap", [108 * 2**20, 2 * GiB, 6 * GiB])     # 108 MiB: pools hold fewer than 16
def test_the_layout_that_runs_more_requests_at_once_is_chosen(cap):
    one = compile_model(SMALL, "cpu", 2, memory_cap=cap, replicas=1, remedies=False).plan
    each = compile_model(SMALL, "cpu", 2, memory_cap=cap, replicas=2, remedies=False).plan
    chosen = compile_model(SMALL, "cpu", 2, memory_cap=cap, remedies=False).plan
    want = 2 if at_once(each) > at_once(one) else 1
    assert chosen.replicas == want
    assert chosen.placement.startswith("2 replicas of one device each chosen" if want == 2 else
                                       "one copy over 2 devices chosen")
    x, y = at_once(each), at_once(one)
    assert f"2 replicas of one device each{' chosen' if want == 2 else ''}: {x:.1f} longest requests at once " \
           f"({x / 2:.1f} each);" in chosen.placement
    assert f"one copy over 2 devices{' chosen' if want == 1 else ''}: {y:.1f} longest requests at once;" \
           in chosen.placement
    assert (one.replicas, len(one.devices), each.replicas, len(each.devices)) == (1, 2, 2, 1)
    assert one.target.count == each.target.count == chosen.target.count == 2
    assert each.placement.startswith("2 replicas of one device each (--replicas 2): ")
    assert one.placement.startswith("one copy over 2 devices (--replicas 1): ")
    assert "of weights on each rank" not in chosen.placement + one.placement + each.placement   # no ranks here


def test_a_layout_counts_the_weights_of_its_fullest_device():
    """One copy of tiny_omni small over two devices: the weights.* lines of each device's ledger, by hand."""
    from graphc.passes.choose_layout import measure

    compiled = compile_model(SMALL, "cpu", 2, memory_cap=6 * GiB, replicas=1, remedies=False)
    held = [sum(n for c, n in d.ledger.items() if c.startswith("weights.")) for d in compiled.plan.devices]
    assert len(set(held)) == 2                                  # the devices hold different weights
    assert measure(compiled.result, 1, 1).weights == max(held)


def test_a_replica_that_does_not_fit_its_share_leaves_one_copy():
    """tiny_omni small on a 76 MiB host of two devices: one device's 38 MiB holds the encoder or the decoder,
    not both (forced layouts show which fits)."""
    cap = 76 * 2**20
    with pytest.raises(DoesNotFit):
        compile_model(SMALL, "cpu", 2, memory_cap=cap, replicas=2, remedies=False)
    chosen = compile_model(SMALL, "cpu", 2, memory_cap=cap, remedies=False).plan
    assert chosen.replicas == 1 and len(chosen.devices) == 2
    assert "2 replicas of one device each: does not fit" in chosen.placement


def test_a_replica_that_does_not_fit_one_card_leaves_one_copy():
    """The shipped two-H100 Omni plan: the 30B model with its budgets does not fit one H100 (the golden
    tests keep the plan current)."""
    plan = load_plan(ROOT / "plans" / "omni_2gpu.plan")
    assert plan.replicas == 1 and len(plan.devices) == 2
    assert "2 replicas of one device each: does not fit" in plan.placement


def test_a_pin_past_the_first_device_rules_replicas_out():
    chosen = compile_model(SMALL, "cpu", 2, {"nodes": {"decoder": {"device": 1}}}, remedies=False).plan
    assert chosen.replicas == 1 and chosen.nodes["decoder"].device == 1
    assert "2 replicas ruled out: node 'decoder' is pinned to device 1" in chosen.placement


@pytest.mark.parametrize("n,forced,message", [(2, 3, "does not divide"), (4, 2, "of 2 devices each"),
                                              (2, 0, "does not divide")])
def test_impossible_replica_counts_are_refused(n, forced, message):
    with pytest.raises(InvalidInput, match=message):
        candidates(n, forced)


def test_the_choice_ranks_by_requests_at_once_and_a_tie_keeps_one_copy():
    one, two = Layout(1, 2, 64.0, "a", 1, 10), Layout(2, 1, 64.0, "b", 1, 10)
    assert choose([two, one], False)[0] is one
    assert choose([one, Layout(2, 1, 64.5, "b", 1, 10)], False)[0].replicas == 2
    assert choose([Layout(1, 2, 0.0, "does not fit", 1, 10), Layout(2, 1, 3.0, "c", 1, 10)], False)[0].replicas == 2
    assert candidates(1, None) == [(1, 1)] and candidates(3, None) == [(1, 1), (3, 1)]
    assert candidates(3, 3) == [(3, 1)] and candidates(3, 1) == [(1, 1)]


def test_ranks_are_offered_where_the_model_declares_them_and_win_a_tie_by_lighter_devices():
    assert candidates(2, None, splits=True) == [(1, 1), (2, 1), (1, 2)]
    assert candidates(2, None, 1, splits=True) == [(1, 1), (2, 1)]             # --tp 1: never split
    assert candidates(2, None, 2, splits=True) == [(1, 2)] == candidates(2, 1, 2, splits=True)
    assert candidates(1, None, splits=True) == [(1, 1)]
    whole, ranks = Layout(1, 2, 64.0, "a", 1, 100), Layout(1, 2, 64.0, "b", 2, 60)
    assert choose([whole, ranks], False)[0] is ranks                          # the same requests, fewer bytes
    assert choose([ranks, Layout(1, 2, 64.0, "a", 1, 50)], False)[0].tp == 1
    assert choose([ranks, Layout(2, 1, 64.0, "c", 1, 10)], False)[0] is ranks     # fewer replicas first
    assert choose([ranks, Layout(2, 1, 70.0, "c", 1, 10)], False)[0].replicas == 2
    win, why = choose([ranks], True)
    assert why == "one copy split over 2 tensor-parallel ranks (--tp 2): 64.0 longest requests at once; b; 60 B of " \
                  "weights on each rank"


@pytest.mark.parametrize("n,forced,tp,message", [(3, None, 2, "--tp 2 with --gpus 3"),
                                                 (2, 2, 2, "--tp 2 with --replicas 2"),
                                                 (4, None, 0, "--tp 0 with --gpus 4")])
def test_impossible_rank_counts_are_refused(n, forced, tp, message):
    with pytest.raises(InvalidInput, match=message):
        candidates(n, forced, tp, splits=True)


def load(running=0, waiting=0, pending=0, free_pages=100, max_running=8, cached=0) -> dict:
    return dict(running=running, waiting=waiting, pending=pending, free_pages=free_pages, max_running=max_running,
                cached=cached)


def test_a_request_goes_to_the_most_cached_rows_with_a_free_slot_then_the_most_free_slots_then_pages():
    assert pick([load(running=3), load(running=1)]) == 1
    assert pick([load(running=1, waiting=2), load(running=2)]) == 1        # waiting requests hold slots too
    assert pick([load(pending=2), load(running=1)]) == 1                    # handed over, not yet taken
    assert pick([load(free_pages=10), load(free_pages=90)]) == 1            # a slot each: the most pages
    assert pick([load(), load()]) == 0
    assert pick([load(max_running=4), load(max_running=8, running=3)]) == 1
    assert pick([load(running=7, cached=32), load(cached=16)]) == 0        # a free slot and more cached rows
    assert pick([load(running=8, cached=32), load(running=7)]) == 1        # no free slot: the cache is moot
    assert pick([load(running=9, cached=32), load(running=8)]) == 1        # both full: the least over


def test_graphc_run_with_ray_refuses_a_plan_of_replicas(tmp_path, capsys):
    plan = tmp_path / "p.plan"
    assert main(["plan", TINY, "--preset", "tiny", "--gpu", "cpu", "--gpus", "2", "--replicas", "2", "-o", str(plan),
                 "-q"]) == 0
    assert main(["run", str(plan), "--random-weights", "--ray", "local"]) == 2
    assert "--ray serves plans of one copy" in capsys.readouterr().err


def test_a_plan_of_ranks_counts_every_rank_and_holds_one_ledger():
    plan = compile_model(load_model(str(ROOT / "models" / "qwen3_5.py"), "tiny"), "cpu", 2, tp=2, remedies=False).plan
    assert (plan.tensor_parallel, plan.replicas, plan.target.count, len(plan.devices)) == (2, 1, 2, 1)
    assert plan.overrides == {"tp": 2}


def test_the_replicas_stats_sum_their_caches():
    """Two replicas' prefix and media caches, summed by hand: /metrics reads the whole server's."""
    from types import SimpleNamespace

    from graphc.runtime.replicas import Replicas

    def one(q, hit, pages, follow, media):
        return {"steps": {"a": 1}, "rungs": {}, "preemptions": 0, "replayed": 0, "eager": 1, "devices": {"0": {}},
                "prefix_cache": {"query_rows": q, "hit_rows": hit, "cached_pages": pages, "idle_pages": pages,
                                 "evicted_pages": 0, "follow_rows": {"hit_rows": follow, "pages": 1}},
                "media_cache": {"enc": {"hits": media, "misses": 1, "stored_bytes": 512}}}
    both = Replicas.__new__(Replicas)
    both.engines = [SimpleNamespace(stats=lambda: one(100, 32, 4, 8, 2)),
                    SimpleNamespace(stats=lambda: one(50, 16, 3, 0, 1))]
    st = both.stats()
    assert st["prefix_cache"] == {"query_rows": 150, "hit_rows": 48, "cached_pages": 7, "idle_pages": 7,
                                  "evicted_pages": 0, "follow_rows": {"hit_rows": 8, "pages": 2}}
    assert st["media_cache"] == {"enc": {"hits": 3, "misses": 2, "stored_bytes": 1024}}
