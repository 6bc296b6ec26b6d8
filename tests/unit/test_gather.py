"""An idle engine gathers requests that arrive together (graphc/serve/driver.py): three requests submitted at once
prepare in worker threads, finishing 0, 150 and 300 ms apart (the host's prompt() slowed by hand); with a gather
window the engine's first step holds all three, without one (gather_ms=0) it holds the first alone. A running
engine never waits; the window is bounded; a bad window is refused."""
from __future__ import annotations

import asyncio
import time

import pytest

from graphc.errors import InvalidInput
from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams
from graphc.serve.driver import Driver
from tests.conftest import ROOT

STAGGER_S = 0.15


@pytest.fixture(scope="module")
def engine():
    """The tiny engine, warmed by two requests through a Driver: a process's first preparations and steps pay
    for lazy imports and first calls (up to about a second on a busy 2-core machine), which the timings below
    must not see."""
    e = Engine(ROOT / "plans" / "tiny_cpu.plan", random_weights=True)
    driver = Driver(e, gather_ms=0)
    try:
        asyncio.run(at_once(driver, [0, 0]))
    finally:
        driver.close()
    yield e
    e.close()


def staggered(engine, seen: list):
    """engine.prepare slowed by STAGGER_S x the prompt's first id, and engine.step recording how many requests
    each step holds; returns the undo."""
    prompt, step = engine.host.prompt, engine.step

    def slow_prompt(ids, media):
        time.sleep(STAGGER_S * ids[0])
        return prompt(ids, media)

    def counting_step():
        load = engine.load()
        seen.append((time.monotonic(), load["running"] + load["waiting"]))
        return step()
    engine.host.prompt, engine.step = slow_prompt, counting_step

    def undo():
        engine.host.prompt, engine.step = prompt, step
    return undo


async def at_once(driver: Driver, firsts: list[int], tokens: int = 2) -> list:
    loop = asyncio.get_running_loop()
    futs = [driver.submit(loop, {"prompt_token_ids": [f, 5, 6], "params": SamplingParams(
        temperature=0, max_tokens=tokens, ignore_eos=True)})[0] for f in firsts]
    reqs = await asyncio.gather(*futs)
    deadline = time.monotonic() + 60
    while any(r.finish_reason is None for r in reqs) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return reqs


def first_step(engine, gather_s: float, firsts: list[int]) -> tuple[int, float]:
    """(requests the first step held, seconds from submitting to that step)."""
    seen: list = []
    undo = staggered(engine, seen)
    driver = Driver(engine, gather_ms=1e3 * gather_s)
    try:
        t0 = time.monotonic()
        reqs = asyncio.run(at_once(driver, firsts))
    finally:
        driver.close()
        undo()
    assert all(r.finish_reason == "length" for r in reqs), [r.finish_reason for r in reqs]
    return seen[0][1], seen[0][0] - t0


def test_an_idle_engine_gathers_the_requests_still_preparing(engine):
    """The window (3 s) ends when the last preparation does (300 ms here): it is long only so that a 2-core
    machine busy with other work still gathers all three."""
    held, _ = first_step(engine, 3.0, [0, 1, 2])
    assert held == 3, f"the first step held {held} of the 3 requests submitted at once"


def test_without_a_window_the_first_request_steps_alone(engine):
    held, _ = first_step(engine, 0.0, [0, 1, 2])
    assert held == 1


def test_the_window_is_bounded(engine):
    """A preparation slower than the window is not waited for: the first step comes about gather_s after the first
    request was ready, holding the one that was."""
    held, after = first_step(engine, 0.05, [0, 10])          # the second prepares for 1.5 s
    assert held == 1 and after < 0.45, (held, after)


def test_a_running_engine_does_not_wait(engine):
    """While a request decodes, the one submitted beside a slow one is stepped as soon as it is admitted: the
    steps between the two admissions go on with no gap of the window's length."""
    seen: list = []
    ends: list[float] = []
    undo = staggered(engine, seen)
    driver = Driver(engine, gather_ms=2000)

    async def scenario():
        loop = asyncio.get_running_loop()
        long = driver.submit(loop, {"prompt_token_ids": [0, 1, 2], "params": SamplingParams(
            temperature=0, max_tokens=1000, ignore_eos=True)})[0]
        first = await long
        while len(seen) < 3:
            await asyncio.sleep(0.005)
        pair = await at_once(driver, [0, 8])                   # one ready at once, one 1.2 s later
        assert first.finish_reason is None, "the long request ended before the pair: nothing to measure"
        ends.append(time.monotonic())
        driver.abort(first.id)
        while first.finish_reason is None:
            await asyncio.sleep(0.01)
        return pair
    try:
        asyncio.run(scenario())
    finally:
        driver.close()
        undo()
    steps = [t for t, _ in seen if t <= ends[0]]              # while the long request ran
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert max(gaps) < 0.3, f"the running engine paused {max(gaps):.2f} s"


def test_a_window_out_of_range_is_refused(engine):
    for bad in (-10, 11_000):
        with pytest.raises(InvalidInput, match="between 0 and 10,000 ms"):
            Driver(engine, gather_ms=bad)
