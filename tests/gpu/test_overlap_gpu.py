"""The overlap of host work on the GPU (graphc/runtime/flight.py), tiny_h100.plan with seeded bf16 weights: a
launched step makes no host sync (torch's sync debug mode raises on one) from the schedule to the sampled
tokens' copy, at every captured decode rung the load reaches; and the tokens of a load with stops read while
the next row is in flight equal an engine's that reads every step first. Skipped without CUDA; needs
flashinfer-python."""
from __future__ import annotations

import pytest
import torch

from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams

pytestmark = pytest.mark.gpu

PROMPTS = [[(7 * i + 13 * j) % 400 + 10 for j in range(n)] for i, n in enumerate((20, 35, 8, 60, 17, 44, 90, 5))]


def drain(engine, items):
    reqs = [engine.add(prompt_token_ids=p, params=sp) for p, sp in items]
    while engine.has_work():
        engine.step()
    assert engine.scheduler.idle() and engine.scheduler.pool_full()
    return reqs


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("flashinfer")
    return Engine("plans/tiny_h100.plan", random_weights=True, emulate=True, prefix_cache=False)


def test_a_decode_launch_makes_no_host_sync(engine, monkeypatch):
    launched = []
    real = engine._launch

    def strict(plan):
        if plan.walk != engine.scheduler.decode_walk:
            return real(plan)
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = real(plan)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        launched.append(plan.rungs.get(engine.llm))
        return out
    monkeypatch.setattr(engine, "_launch", strict)
    engine.overlap = True
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    reqs = drain(engine, [(p, greedy) for p in PROMPTS])
    assert all(r.finish_reason == "length" and not r.error for r in reqs), [r.error for r in reqs if r.error]
    assert len(set(launched)) >= 2 and None not in launched, launched     # captured rungs, more than one


def test_stops_in_flight_give_the_tokens_of_reading_every_step(engine):
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    engine.overlap = False
    solo = [r.output for r in drain(engine, [(p, greedy) for p in PROMPTS])]
    items = []
    for p, out in zip(PROMPTS, solo):
        k = next((k for k in range(3, len(out)) if out[k] not in out[:k]), None)
        stops = (out[k],) if k is not None else ()
        items.append((p, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop_token_ids=stops)))
    got = {}
    for on in (True, False):
        engine.overlap = on
        got[on] = [(r.output, r.finish_reason) for r in drain(engine, items)]
    assert got[True] == got[False]
    assert any(reason == "stop" for _, reason in got[True])
