"""Stream lanes on the GPU (graphc/lanes.py): the shipped Omni plan for the card (qwen3_omni_h200.plan on an H200,
the 80 GB one on an H100) served with seeded bf16 weights, re-planned with `lanes.speak=false` (one stream) and
with `lanes.speak=true` (the talker and Code2Wav on a stream of their own, their graphs in a pool of their own). Six
greedy t2s requests arrive over several steps; every request's text tokens, codec frames and audio samples are
the same bit for bit in both (the lane changes where steps run, not what they compute or which rows a step
takes), and the lane's two capture pools are off their lines by what the one-stream plan's one pool is off its
line, within 64 MiB (the lane adds no error to the allocator model). Each engine boots in a process of its own
(the card holds one). Skipped without CUDA; needs flashinfer-python."""
from __future__ import annotations

import multiprocessing as mp
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.gpu


def shipped_for_card() -> str:
    name = torch.cuda.get_device_name(0)
    if "H200" in name:
        return "qwen3_omni_h200"
    if "H100" in name:
        return "qwen3_omni_h100_seed80gb_fit"
    pytest.skip(f"no shipped Omni plan for {name}")


def plan_of(name: str, lanes: bool):
    """The shipped plan's inputs re-planned with the speak lane on or off; the SM90 MoE kernels dropped where
    their package (nvidia-cutlass-dsl) is missing: no step here reaches their 2,048 rows."""
    sys.path[:0] = [str(ROOT / "examples" / "tools"), str(ROOT / "examples" / "bench")]
    from bench_steps import drop_kernels
    from regen_plans import compile_shipped
    plan = compile_shipped(name, sections={"lanes": {"speak": lanes}})
    try:
        import cutlass  # noqa: F401
    except ImportError:
        drop_kernels(plan, ["moe_sm90_from"])
    return plan


def serve(name: str, lanes: bool) -> dict:
    """Boot, serve six greedy t2s requests arriving at fixed steps; their outputs, the boot's streams and lines."""
    from graphc.runtime.engine import Engine
    from tests.gpu.arrivals import run_speech

    engine = Engine(plan_of(name, lanes), random_weights=True)
    reqs = run_speech(engine)
    outs = [engine.output(r) for r in reqs]
    return {"tokens": [o.token_ids for o in outs], "codes": [o.audio_codes for o in outs],
            "audio": [np.asarray(o.audio, dtype=np.float32) for o in outs], "errors": [o.error for o in outs],
            "streams": sorted(engine.boot.streams), "lines": engine.stats()["devices"]["0"]["lines"]}


def _serve_into(name: str, lanes: bool, path: str) -> None:
    Path(path).write_bytes(pickle.dumps(serve(name, lanes)))


def in_fresh_process(name: str, lanes: bool, folder: Path) -> dict:
    """serve() in a process of its own (the last engine's memory is gone), not a daemon: the engine's boot starts
    processes of its own, which a daemonic pool worker may not."""
    path = folder / f"lanes_{lanes}.pkl"
    child = mp.get_context("spawn").Process(target=_serve_into, args=(name, lanes, str(path)))
    child.start()
    child.join()
    assert child.exitcode == 0, f"serving with lanes={lanes} failed in its process (exit {child.exitcode}); its " \
                                f"traceback is above"
    return pickle.loads(path.read_bytes())


def test_the_speak_lane_serves_the_same_speech_bit_for_bit(tmp_path):
    pytest.importorskip("flashinfer")
    name = shipped_for_card()
    one, two = (in_fresh_process(name, lanes, tmp_path) for lanes in (False, True))
    assert one["streams"] == [] and two["streams"] == ["code2wav", "talker"]
    assert all(e is None for e in one["errors"] + two["errors"])
    assert all(len(c) > 5 for c in one["codes"])
    assert one["tokens"] == two["tokens"] and one["codes"] == two["codes"]
    for a, b in zip(one["audio"], two["audio"]):
        assert a.shape == b.shape and np.array_equal(a, b)
    assert "capture_pool.speak" not in one["lines"]
    for line in ("capture_pool", "capture_pool.speak"):
        print(f"{line}: planned {two['lines'][line][0]:,} B, measured {two['lines'][line][1]:,} B")
    # the lane adds no error of its own to the allocator model: its two pools are over their lines by what the
    # one pool of the plan without it is over its line (on the 80 GB plan, Code2Wav's largest graph's 104 MiB,
    # status.md), give or take 64 MiB
    over_one = one["lines"]["capture_pool"][1] - one["lines"]["capture_pool"][0]
    over_two = sum(two["lines"][line][1] - two["lines"][line][0] for line in ("capture_pool", "capture_pool.speak"))
    print(f"pools over their lines: one stream {over_one:,} B, with the lane {over_two:,} B")
    assert abs(over_two - over_one) <= 64 << 20, (over_one, over_two)
    assert over_one <= one["lines"]["capture_pool"][0] * 0.03, "the one-stream pool is off its line by over 3%"
