"""Would two captured steps run faster side by side on two CUDA streams than one after the other? One plan
device booted with two of its graphs captured (A in the boot's pool, B captured again into a pool of its own, so
their intermediates never share memory), each prepared as examples/bench/bench_steps.py does (random token
ids; --sampled: the talker's default sampling), then timed with CUDA events (median of --rounds rounds):

- A alone and B alone: one replay each;
- serial: a round of --mix A replays then B replays on one stream (what the engine does now);
- two streams: the same round with A's replays on one stream and B's on another, started together.

    python examples/bench/bench_two_streams.py PLAN OUT.json thinker/decode:seqs/16 talker/decode:seqs/16 --mix 1 3 \
        [--sampled] [--drop moe_sm90_from]

A round's saving is serial - two streams; the ratio two streams / serial is what overlapping the engine's lanes
on the GPU could at most gain for that mix. The outputs of the replays are not checked (timing only).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "bench")]

import torch  # noqa: E402

from bench_steps import drop_kernels, prepare, time_graph  # noqa: E402
from graphc.modules import KERNEL_KNOBS  # noqa: E402
from graphc.plan import load_plan, parse_graph_id  # noqa: E402
from graphc.runtime.boot import boot_plan  # noqa: E402


def round_ms(a, b, mix: tuple[int, int], streams: tuple | None, rounds: int, warmup: int = 3) -> float:
    """Median ms of a round: mix[0] replays of a and mix[1] of b, on the current stream (streams None) or a's on
    streams[0] and b's on streams[1], both waiting for the round's start and joined at its end."""
    times = []
    main = torch.cuda.current_stream()
    for i in range(warmup + rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for graph, n, s in ((a, mix[0], streams and streams[0]), (b, mix[1], streams and streams[1])):
            if s is None:
                for _ in range(n):
                    graph.replay()
                continue
            s.wait_stream(main)
            with torch.cuda.stream(s):
                for _ in range(n):
                    graph.replay()
        if streams is not None:
            for s in streams:
                main.wait_stream(s)
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan")
    ap.add_argument("out")
    ap.add_argument("a", help="graph id: node/family/rung")
    ap.add_argument("b")
    ap.add_argument("--mix", nargs=2, type=int, default=[1, 1], metavar=("A", "B"), help="replays of each a round")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--sampled", action="store_true", help="the talker's default sampling in its rows")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--drop", nargs="*", default=[], choices=KERNEL_KNOBS,
                    help="knobs taken away on every node (e.g. moe_sm90_from, whose kernels a decode step never "
                         "runs, where their package is not installed)")
    a = ap.parse_args()
    plan = load_plan(a.plan)
    drop_kernels(plan, a.drop)
    for i, d in enumerate(plan.devices):
        if d.index == a.device:
            missing = {a.a, a.b} - set(d.capture_order)
            if missing:
                sys.exit(f"bench_two_streams: device {d.index} captures no {', '.join(sorted(missing))}")
            plan.devices[i] = d.model_copy(update={"capture_order": [g for g in d.capture_order if g in (a.a, a.b)]})
    (boot,) = boot_plan(plan, devices=[a.device], emulate=True)
    mix = tuple(a.mix)
    with torch.inference_mode():
        # b captured again into a pool and on a stream of its own (the boot's runtime, as a stream lane's graphs are),
        # before prepare sets both graphs' inputs
        boot.runtime.capture_pool("_bench_b", [parse_graph_id(a.b)])
        graph_a, graph_b = boot.graphs[a.a], boot.graphs[a.b]
        for key in (a.a, a.b):
            prepare(boot, key, a.sampled)
        rows = {"a": a.a, "b": a.b, "mix": list(mix), "gpu": torch.cuda.get_device_name(),
                "a_ms": time_graph(graph_a, 5, a.rounds), "b_ms": time_graph(graph_b, 5, a.rounds),
                "serial_ms": round_ms(graph_a, graph_b, mix, None, a.rounds),
                "two_streams_ms": round_ms(graph_a, graph_b, mix, (torch.cuda.Stream(), torch.cuda.Stream()),
                                           a.rounds)}
    rows["ratio"] = rows["two_streams_ms"] / rows["serial_ms"]
    for k, v in rows.items():
        print(f"{k:16s} {v:.3f}" if isinstance(v, float) else f"{k:16s} {v}", flush=True)
    Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
