"""Where a served round leaves the GPU idle, and which host calls synchronise with it: helpers for the benches'
--profile rounds (bench_video.py).

annotated(engine): for the block's duration, the engine's phases are timed (the engine's step, the scheduler,
each node's run, the host's encoder batch, the sampler, the read-back of a step in flight, an admission) and
aligned() puts them on the trace's clock. idle_lines(events): from a chrome trace's events, the GPU's idle
time between its first and last work, split by the innermost label the engine's thread was in at each moment
("outside any label": the server's loop between steps, a wait for requests). synced(): the host calls that
synchronised with the GPU (torch.cuda.set_sync_debug_mode), counted by the line that made them.
"""
from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections import Counter

IDLE_MIN_US = 20.0            # gaps shorter than this are a kernel's launch latency, not idleness


ANCHOR = "graphc clock"      # a label on the profiling thread that ties perf_counter to the trace's clock


def _wrap(obj, name: str, label, spans: list) -> None:
    orig = getattr(obj, name)

    @functools.wraps(orig)
    def run(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return orig(*args, **kwargs)
        finally:
            spans.append((t0, time.perf_counter(), label(*args) if callable(label) else label))
    setattr(obj, name, run)


@contextlib.contextmanager
def annotated(engine):
    """The engine's phases timed for the block (torch.profiler records only the thread that started it, and
    the engine steps in its own): yields a list of (start, end, label) in perf_counter seconds, and marks the
    trace with ANCHOR at a known perf_counter time (aligned() converts). The instance's own attributes after."""
    import torch

    ex, spans = engine.executor, []
    targets = [(engine, "step", "engine.step"), (engine, "admit", "engine.admit"), (engine, "_read", "read back"),
               (engine.scheduler, "schedule", "schedule"), (ex, "_encode", "encoder step"),
               (engine.host, "encode", "host.encode"), (ex, "_llm", "llm step"),
               (ex, "run_node", lambda node, walk, *_: f"run {node} ({walk})"), (engine, "sampler", "sample")]
    saved = [(obj, name, obj.__dict__.get(name)) for obj, name, _ in targets]
    for obj, name, label in targets:
        _wrap(obj, name, label, spans)
    for _ in range(3):                 # the first record_function call is slow to start: the last one anchors
        with torch.profiler.record_function(ANCHOR):
            spans.append((time.perf_counter(), None, ANCHOR))
    try:
        yield spans
    finally:
        for obj, name, old in saved:
            if old is None:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


def aligned(spans: list, events: list[dict]) -> list[dict]:
    """annotated()'s spans as trace events (cat user_annotation, µs on the trace's clock)."""
    anchor = max(e["ts"] for e in events if e.get("name") == ANCHOR)
    t_anchor = max(t0 for t0, t1, name in spans if name == ANCHOR)
    return [{"cat": "user_annotation", "name": name, "ts": anchor + (t0 - t_anchor) * 1e6, "dur": (t1 - t0) * 1e6}
            for t0, t1, name in spans if t1 is not None]


def _busy(events: list[dict]) -> list[tuple[float, float]]:
    """The GPU's busy intervals (kernels, copies, sets), merged, in µs."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    merged: list[list[float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1] + IDLE_MIN_US:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _innermost(events: list[dict]) -> list[tuple[float, float, str]]:
    """The engine thread's labels flattened into (start, end, innermost label) segments, in µs."""
    labels = sorted(((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") == "user_annotation"
                     and not e["name"].startswith("ProfilerStep")), key=lambda s: (s[0], -s[1]))
    segs, stack, at = [], [], None
    for a, b, name in labels + [(float("inf"), float("inf"), "")]:
        while stack and stack[-1][1] <= a:             # close labels that end before this one starts
            end, top = stack[-1][1], stack.pop()
            segs.append((at, end, top[2]))
            at = end
        if stack and at < a:
            segs.append((at, a, stack[-1][2]))
        stack.append((a, b, name))
        at = a
    return [s for s in segs if s[1] > s[0]]


def idle_lines(events: list[dict]) -> list[str]:
    """The GPU's idle time from its first to its last work, by the engine thread's innermost label."""
    busy = _busy(events)
    if not busy:
        return []
    gaps = [(busy[i][1], busy[i + 1][0]) for i in range(len(busy) - 1)]
    by = Counter()
    segs = _innermost(events)
    j = 0
    for a, b in gaps:
        covered = 0.0
        while j < len(segs) and segs[j][1] <= a:
            j += 1
        k = j
        while k < len(segs) and segs[k][0] < b:
            s, e, name = segs[k]
            part = min(b, e) - max(a, s)
            if part > 0:
                by[name] += part
                covered += part
            k += 1
        by["outside any label"] += (b - a) - covered
    total = sum(b - a for a, b in gaps)
    lines = [f"GPU idle {total / 1e3:.1f} ms between its first and last work ({len(gaps)} gaps of "
             f">= {IDLE_MIN_US:g} us), by what the engine's thread was doing:"]
    lines += [f"  {us / 1e3:9.1f} ms  {name}" for name, us in by.most_common() if us >= 100]
    return lines


@contextlib.contextmanager
def synced(into: list[str]):
    """Count the host calls that synchronise with the GPU in the block (torch's sync debug mode, warn), by the
    line that made them: appended to `into`."""
    import torch

    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
    where = Counter(f"{w.filename}:{w.lineno}" for w in got if "synchroniz" in str(w.message))
    into.append(f"host calls that synchronised with the GPU: {sum(where.values())}")
    into += [f"  {n:6d}  {loc}" for loc, n in where.most_common(25)]
