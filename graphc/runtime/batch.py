"""A batch of parsed requests run to its end on an engine, and its throughput: what `graphc run --requests`
reports, whether the engine runs in this process (graphc/cli.py) or in the engine's Ray actor
(graphc/runtime/ray_run.py)."""
from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def run_batch(engine, parsed: list) -> tuple[list, dict, str]:
    """A batch run to its end (Engine.run_parsed): the outputs, the stats with throughput, their line.
    Where the engine runs: this process, or the engine's Ray actor. A Ctrl-C ends it (sigint_latch)."""
    t0 = time.perf_counter()
    with sigint_latch() as interrupted:
        outs = engine.run_parsed(parsed, progress=True, stop=interrupted)
    wall = time.perf_counter() - t0
    stats = engine.stats(wall) | throughput([o for o in outs if o.error is None], wall)
    for d, mem in engine.device_memory().items():       # after the run: NCCL's buffers are there now
        stats["devices"][str(d)]["after_run"] = mem
    return outs, stats, engine.stats_line(stats)


def throughput(outs, wall: float) -> dict:
    """Generated tokens a second over the run, and time to first token over the requests."""
    ttft = sorted(o.times["ttft_s"] for o in outs if "ttft_s" in o.times)
    gen = sum(len(o.token_ids) for o in outs)

    def q(p: float) -> float:
        return ttft[min(len(ttft) - 1, int(p * len(ttft)))] if ttft else float("nan")
    return {"requests": len(outs), "generated_tokens": gen, "prompt_tokens": sum(o.prompt_tokens for o in outs),
            "tokens_per_s": gen / wall if wall else float("nan"),
            "ttft_s": {"mean": sum(ttft) / len(ttft) if ttft else float("nan"), "p50": q(0.5), "p90": q(0.9),
                       "max": ttft[-1] if ttft else float("nan")}}


@contextmanager
def sigint_latch() -> Iterator[Callable[[], bool]]:
    """Within it, SIGINT raises KeyboardInterrupt as Python's own handler does and is also remembered; yields
    whether one came. Python drops a KeyboardInterrupt raised while a weakref callback or a __del__ runs (it
    prints "Exception ignored" and goes on; seen once during a batch's first steps, in an import lock's
    callback), so the batch's loop asks between steps as well. Outside the main thread, or where SIGINT is not
    Python's own handler (ignored in a process started in the background, or a host's own, as Ray's workers may
    set), nothing is installed and it yields never."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield lambda: False
        return
    seen: list[int] = []

    def latch(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGINT, latch)
    try:
        yield lambda: bool(seen)
    finally:
        signal.signal(signal.SIGINT, before)
