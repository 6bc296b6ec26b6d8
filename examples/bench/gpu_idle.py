"""Where a served round leaves the GPU idle, and which host calls synchronise with it: helpers for the benches'
--profile rounds (bench_video.py, bench_speech.py).

trace_events(prof): a finished torch.profiler's complete events. busy_lines(events): the GPU's busy time, on
each CUDA stream and all streams together (what the streams' overlap saves), and the host to device copies.
launched_lines(events): the GPU's time by the engine thread's innermost label when the work was launched (a
node's step, the sampler).

annotated(engine): for the block's duration, the engine's phases are timed (the engine's step, the scheduler,
each node's run, the host's encoder batch, the sampler, the read-back of a step in flight, an admission) and
aligned() puts them on the trace's clock. idle_lines(events): from a chrome trace's events, the GPU's idle
time between its first and last work, split by the innermost label the engine's thread was in at each moment
("outside any label": the server's loop between steps, a wait for requests). synced(): the host calls that
synchronised with the GPU (torch.cuda.set_sync_debug_mode), counted by the line that made them.
"""
from __future__ import annotations

import bisect
import contextlib
import functools
import json
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

IDLE_MIN_US = 20.0            # gaps shorter than this are a kernel's launch latency, not idleness


ANCHOR = "graphc clock"      # a label on the profiling thread that ties perf_counter to the trace's clock
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")     # the trace's GPU work


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
    if engine.speech is not None:      # a speaking plan's follow and chunk stages
        targets += [(engine.speech, "read_follow", "read back follow"), (engine.speech, "run_follow", "follow step"),
                    (engine.speech, "run_chunks", "chunk step")]
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
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in GPU_CATS)
    merged: list[list[float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1] + IDLE_MIN_US:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def trace_events(prof) -> list[dict]:
    """A finished torch.profiler's complete ("X") events, through its chrome trace."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        return [e for e in json.loads(Path(f.name).read_text())["traceEvents"] if e.get("ph") == "X"]


def _union_us(spans: list[tuple[float, float]]) -> float:
    """The length of the union of [a, b) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def busy_lines(events: list[dict]) -> list[str]:
    """The GPU's first and last work after the trace's start, its busy time on each stream (the kernels' own
    time) and on all of them together (the union: less than the sum where the streams overlapped), and the
    host to device copies."""
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    if not gpu:
        return ["no GPU work recorded (a CPU plan)"]
    start, end = min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in gpu)
    streams = Counter()
    for e in gpu:
        streams[e.get("tid", "?")] += e["dur"]
    union = _union_us([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    copies = [e for e in gpu if "HtoD" in e["name"]]
    lines = [f"GPU busy {union / 1e3:.1f} ms of the {(end - gpu[0]['ts']) / 1e3:.1f} ms from its first work (at "
             f"{(gpu[0]['ts'] - start) / 1e3:.1f} ms after the profiler started) to its last, over {len(gpu)} "
             f"kernels and copies; the streams' own times sum to {sum(streams.values()) / 1e3:.1f} ms"]
    lines += [f"  stream {tid}: {us / 1e3:.1f} ms" for tid, us in streams.most_common()]
    lines.append(f"host to device copies: {len(copies)}, {sum(e['dur'] for e in copies) / 1e3:.1f} ms, "
                 f"{sum(e.get('args', {}).get('bytes', 0) for e in copies) / 1e6:.1f} MB")
    return lines


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


def launched_lines(events: list[dict]) -> list[str]:
    """The GPU's time by the innermost label the engine's thread was in when it launched the work: each
    kernel or copy is tied to its launch call (cuda_runtime or cuda_driver events) by the trace's
    correlation id. Work whose launch is not in the trace counts as "launch not recorded"."""
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    segs = _innermost(events)
    starts = [s[0] for s in segs]
    by = Counter()
    for e in events:
        if e.get("cat") not in GPU_CATS:
            continue
        ts = launch.get(e.get("args", {}).get("correlation"))
        i = bisect.bisect_right(starts, ts) - 1 if ts is not None else -1
        name = segs[i][2] if i >= 0 and ts < segs[i][1] else "outside any label"
        by[name if ts is not None else "launch not recorded"] += e["dur"]
    if not by:
        return []
    lines = [f"GPU time {sum(by.values()) / 1e3:.1f} ms, by what the engine's thread was doing at its launch:"]
    return lines + [f"  {us / 1e3:9.1f} ms  {name}" for name, us in by.most_common() if us >= 100]


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
