"""The bench helper that splits a trace's GPU idle time by the engine thread's innermost label, against
hand-worked traces (times in units of 100 us)."""
from examples.bench.gpu_idle import _innermost, idle_lines

U = 100.0


def kernel(ts, dur):
    return {"cat": "kernel", "ts": ts * U, "dur": dur * U, "name": "k"}


def label(name, ts, dur):
    return {"cat": "user_annotation", "ts": ts * U, "dur": dur * U, "name": name}


# GPU work 0-10, 50-60, 100-110 and 110.1-115 (a 10 us gap: launch latency, not idle); labels nested in a step
EVENTS = [kernel(0, 10), kernel(50, 10), kernel(100, 10), kernel(110.1, 4.9),
          label("step", 5, 100), label("read", 20, 20), label("sample", 70, 10), label("admit", 130, 5)]


def by_label(lines: list[str]) -> dict[str, float]:
    return {ln.split("ms  ")[1]: float(ln.split("ms")[0]) for ln in lines[1:]}


def test_innermost_label_segments_nest():
    assert _innermost(EVENTS) == [(5 * U, 20 * U, "step"), (20 * U, 40 * U, "read"), (40 * U, 70 * U, "step"),
                                  (70 * U, 80 * U, "sample"), (80 * U, 105 * U, "step"), (130 * U, 135 * U, "admit")]


def test_idle_time_by_innermost_label():
    # gaps 10-50 and 60-100: step 10-20, read 20-40, step 40-50; step 60-70, sample 70-80, step 80-100
    lines = idle_lines(EVENTS)
    assert lines[0].startswith("GPU idle 8.0 ms") and "(2 gaps" in lines[0]
    assert by_label(lines) == {"step": 5.0, "read": 2.0, "sample": 1.0}


def test_idle_time_outside_labels():
    lines = idle_lines([kernel(0, 10), kernel(110, 10), label("read", 10, 30), label("admit", 200, 5)])
    assert by_label(lines) == {"outside any label": 7.0, "read": 3.0}
