"""Memory sizing and placement, on the tiny model under random settings and caps."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphc.allocator import Allocator
from graphc.pipeline import run_passes
from graphc.overrides import apply_overrides
from graphc.targets import get_target
from graphc.units import GiB, MiB

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

overrides = st.fixed_dictionaries({
    "walks": st.fixed_dictionaries({
        "decode": st.fixed_dictionaries({"budget": st.fixed_dictionaries({"seqs": st.sampled_from([4, 8, 16])})}),
        "prefill": st.fixed_dictionaries({"budget": st.fixed_dictionaries({"tokens": st.sampled_from([32, 64, 128])})}),
        "audio_prefill": st.fixed_dictionaries({"capture_limit": st.fixed_dictionaries(
            {"encoder": st.sampled_from([0, 1, 2, 4])})}),
    }),
    "resources": st.fixed_dictionaries({"decoder_kv": st.fixed_dictionaries(
        {"pages": st.sampled_from([None, 300, 3000])})}),
})
gpus = st.sampled_from(["h100", "a100-40gb", "l40s", "b300"])
caps = st.integers(min_value=600 * MiB, max_value=3 * GiB)


def run(src, gpu, ov, cap, n=1):
    return run_passes(apply_overrides(src.model, ov), get_target(gpu, cap), n)


@SETTINGS
@given(ov=overrides, gpu=gpus, cap=caps, n=st.sampled_from([1, 2]))
def test_ledger_adds_up_and_placement_never_overfills(tiny_small, ov, gpu, cap, n):
    r = run(tiny_small, gpu, ov, cap, n)
    for d in r.placement.devices:
        assert d.total == sum(i.bytes for i in d.items)
        assert all(i.bytes >= 0 for i in d.items)
        assert all(p >= 0 for p in d.kv_pages.values())
        if r.fit.fits:
            assert d.total <= d.capacity
    # a plan fits exactly when no device is over and no KV pool is short of the longest request
    short = any(pages < s.min_pages for d in r.placement.devices for res, pages in d.kv_pages.items()
                for s in [r.sizing.ir.model.resource(res)])
    assert r.fit.fits == (all(d.free >= 0 for d in r.placement.devices) and not short)


@SETTINGS
@given(ov=overrides, gpu=gpus, a=caps, b=caps)
def test_more_memory_never_makes_a_fitting_plan_fail(tiny_small, ov, gpu, a, b):
    small, big = sorted((a, b))
    if run(tiny_small, gpu, ov, small).fit.fits:
        assert run(tiny_small, gpu, ov, big).fit.fits


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ov=overrides)
def test_a_plan_that_fits_a_gpu_fits_a_bigger_one(tiny_small, ov):
    order = ["a100-40gb", "h100", "h200"]          # sm_80 / sm_90 / sm_90, growing memory
    fits = [run(tiny_small, g, ov, None).fit.fits for g in order]
    assert fits == sorted(fits)                     # once it fits, it keeps fitting


events = st.lists(st.tuples(st.booleans(), st.integers(1, 40 << 20)), min_size=1, max_size=60)


@given(events)
def test_allocator_reserves_at_least_what_is_live(evs):
    a = Allocator()
    live, last = [], 0
    for i, (alloc, size) in enumerate(evs):
        if alloc or not live:
            a.malloc(i, size)
            live.append(i)
        else:
            a.free(live.pop(size % len(live)))
        assert a.reserved >= a.allocated >= 0 and a.reserved >= last
        last = a.reserved
    assert a.peak_allocated <= a.reserved
