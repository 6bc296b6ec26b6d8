"""Pure jobs on a pool of forked workers (issue 14: the simulation's missing traces).

A forked worker inherits what this process has imported and built (torch, the meta modules) instead of
importing and building again, so a pool pays off even for jobs of tens of milliseconds. Only where fork
is safe and cheap: Linux, and never once this process has started CUDA (a child must not inherit its
context). A job must be a pure function of its arguments (where it runs changes nothing); one that
raises comes back as None, for the caller to run again in this process, where it raises as itself.

    GRAPHC_PLAN_WORKERS   processes (default: the cores, at most 8); 1: no pool
"""
from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator

from graphc.errors import InvalidInput

MIN_JOBS = 8            # fewer jobs than this are not worth a pool

_TASK: list = []        # (function, arguments) of the pool running now: the workers inherit it


def workers() -> int:
    """GRAPHC_PLAN_WORKERS, else this machine's cores (at most 8) on Linux, else 1."""
    n = os.environ.get("GRAPHC_PLAN_WORKERS")
    if n is not None:
        try:
            return max(1, int(n))
        except ValueError:
            raise InvalidInput(f"GRAPHC_PLAN_WORKERS={n!r} is not a number", "it is how many processes trace steps",
                               "set it to a whole number (1: no pool), or unset it") from None
    return min(os.cpu_count() or 1, 8) if sys.platform == "linux" else 1


def size(jobs: int) -> int:
    """The workers a pool for this many jobs gets: 0 where it would not pay or is not safe."""
    n = min(workers(), jobs)
    if n < 2 or jobs < MIN_JOBS or sys.platform != "linux" or _cuda_started():
        return 0
    return n


def _cuda_started() -> bool:
    import torch

    return torch.cuda.is_initialized()


def _call(i: int):
    fn, args = _TASK[0]
    try:
        return i, fn(*args[i])
    except Exception:
        return i, None


def imap(fn: Callable, args: list[tuple], n: int) -> Iterator[tuple[int, object]]:
    """(index, fn(*args[index]) or None where it raised) for every job, as the n workers finish them."""
    _TASK[:] = [(fn, args)]
    try:
        with multiprocessing.get_context("fork").Pool(n) as pool:
            yield from pool.imap_unordered(_call, range(len(args)))
    finally:
        _TASK.clear()
