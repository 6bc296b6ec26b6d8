"""A Ctrl-C during `graphc run --requests` ends the batch even where Python drops its KeyboardInterrupt (raised
inside a weakref callback or a __del__, Python prints "Exception ignored" and goes on): batch.sigint_latch
remembers the signal and the engine's loop asks before each step. Here a step swallows the interrupt as such a
callback would; the batch must stop before the next step, with KeyboardInterrupt, and SIGINT's handler is
Python's own again after it."""
import os
import signal
import time
from pathlib import Path

import pytest

from graphc.runtime.batch import run_batch, sigint_latch
from graphc.runtime.engine import Engine, parse_or_refuse

ROOT = Path(__file__).resolve().parents[2]


def _swallowed_sigint():
    """SIGINT to this process, its KeyboardInterrupt dropped where it lands (as Python drops one raised in a
    weakref callback)."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)                      # the handler runs in this frame
    except KeyboardInterrupt:
        pass


def test_a_dropped_ctrl_c_still_ends_the_batch(monkeypatch):
    engine = Engine(ROOT / "plans" / "tiny_cpu.plan", random_weights=True)
    steps, step = [], engine.step

    def counted():
        steps.append(1)
        if len(steps) == 3:
            _swallowed_sigint()
        return step()

    monkeypatch.setattr(engine, "step", counted)
    items = [{"prompt_token_ids": [1, 2, 3], "max_tokens": 40, "ignore_eos": True} for _ in range(2)]
    # SIGINT as a terminal's `graphc run` has it (Python's own handler): pytest started in the background inherits
    # it ignored, and the latch then rightly stays out
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_batch(engine, [parse_or_refuse(x, i) for i, x in enumerate(items)])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
    assert len(steps) == 3


def test_where_sigint_is_ignored_or_handled_by_another_the_latch_leaves_it_so():
    seen = []
    for handler in (signal.SIG_IGN, lambda signum, frame: seen.append(signum)):
        before = signal.signal(signal.SIGINT, handler)
        try:
            with sigint_latch() as interrupted:
                assert signal.getsignal(signal.SIGINT) is handler
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                assert not interrupted()
        finally:
            signal.signal(signal.SIGINT, before)
    assert seen == [signal.SIGINT]
