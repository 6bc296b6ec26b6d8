"""The server prepares each request (its prompt, its media through the model's host) in a worker thread, not in
the engine's: two requests whose preprocessing is slow prepare at the same time, and the engine goes on
stepping a running request meanwhile. The host's prompt() is slowed by hand for prompts that start 7, 7, 7."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from graphc.runtime.engine import Engine
from tests.conftest import ROOT
from tests.unit.loopback import post_json, serve

SLOW_S = 0.6


def test_slow_preprocessing_runs_in_parallel_and_never_holds_the_engine():
    engine = Engine(ROOT / "plans" / "tiny_cpu.plan", random_weights=True)
    seen, steps, lock = [], [], threading.Lock()
    prompt, step = engine.host.prompt, engine.step

    def slow_prompt(ids, media):
        t0 = time.monotonic()
        if ids[:3] == [7, 7, 7]:
            time.sleep(SLOW_S)
        with lock:
            seen.append((ids[:3] == [7, 7, 7], threading.current_thread().name, t0, time.monotonic()))
        return prompt(ids, media)

    def timed_step():                                      # 200 steps of the long request: 2 s at least
        steps.append(time.monotonic())
        time.sleep(0.01)
        return step()
    engine.host.prompt, engine.step = slow_prompt, timed_step
    server, port = serve(engine)
    try:
        body = {"model": "tiny_omni-tiny", "temperature": 0, "ignore_eos": True}
        with ThreadPoolExecutor(3) as pool:
            long = pool.submit(post_json, port, "/v1/completions", body | {"prompt": [1, 2, 3], "max_tokens": 200})
            deadline = time.monotonic() + 60
            while len(steps) < 5 and not long.done() and time.monotonic() < deadline:    # the long one decodes
                time.sleep(0.01)
            slow = [pool.submit(post_json, port, "/v1/completions", body | {"prompt": [7, 7, 7, i], "max_tokens": 2})
                    for i in range(2)]
            codes = [f.result()[0] for f in [long, *slow]]
    finally:
        server.should_exit = True
        engine.close()
    assert codes == [200, 200, 200]
    slow_ones = [(name, a, b) for is_slow, name, a, b in seen if is_slow]
    assert len(slow_ones) == 2 and all(name != "graphc-engine" for name, _, _ in slow_ones), seen
    (_, a0, b0), (_, a1, b1) = slow_ones
    assert max(a0, a1) < min(b0, b1), "the two slow preparations did not overlap"
    during = [t for t in steps if max(a0, a1) < t < min(b0, b1)]
    assert len(during) >= 10, f"the engine stepped {len(during)} times while the requests prepared"
