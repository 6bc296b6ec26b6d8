"""The bench helper that splits a trace's GPU idle time by the engine thread's innermost label, against
hand-worked traces (times in units of 100 us)."""
from examples.bench.gpu_idle import _innermost, busy_lines, idle_lines, launched_lines

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


def on(stream, ts, dur, corr=None):
    e = kernel(ts, dur) | {"tid": stream}
    return e | {"args": {"correlation": corr}} if corr is not None else e


def launch(ts, corr):
    return {"cat": "cuda_runtime", "ts": ts * U, "dur": 0.1 * U, "name": "cudaGraphLaunch",
            "args": {"correlation": corr}}


def test_busy_time_per_stream_and_their_union():
    # stream 7: 0-10 and 20-30; stream 9: 5-25 (overlaps both); union 0-30 = 3.0 ms, own times 2.0 + 2.0
    lines = busy_lines([on(7, 0, 10), on(7, 20, 10), on(9, 5, 20), label("step", 0, 40)])
    assert lines[0].startswith("GPU busy 3.0 ms of the 3.0 ms") and "sum to 4.0 ms" in lines[0]
    assert lines[1:3] == ["  stream 7: 2.0 ms", "  stream 9: 2.0 ms"]


def test_gpu_time_by_the_label_at_its_launch():
    # launches at 1 (in "run a" 0-5), 6 (in "step" 0-20 outside "run a") and 30 (no label); one kernel unmatched
    events = [label("step", 0, 20), label("run a", 0, 5), launch(1, 1), launch(6, 2), launch(30, 3),
              on(7, 2, 10, 1), on(7, 12, 3, 1), on(7, 40, 4, 2), on(9, 31, 6, 3), on(9, 50, 2)]
    lines = launched_lines(events)
    assert lines[0].startswith("GPU time 2.5 ms")
    assert by_label(lines) == {"run a": 1.3, "step": 0.4, "outside any label": 0.6, "launch not recorded": 0.2}
