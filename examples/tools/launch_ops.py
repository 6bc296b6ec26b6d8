"""Where a captured graph's launches go: the compiler's simulation of one graph of a plan (every operator that
writes memory, as bench_steps.py's launches column counts them), by operator, most first. Allocations
(aten.empty and kin) are counted there but run no kernel inside a CUDA graph; they are listed apart. No GPU.

    python examples/tools/launch_ops.py plans/qwen3_omni_h200.plan talker/decode:seqs/1 [--with KNOB ...]

The kernels are those the compiler chooses now for the plan's target (select_backends), --with KNOB adding a
knob at 1 on every node that has kernels (as examples/bench/ab_kernels.py --with does on the GPU).

Kernels that run outside the traced operators (FlashInfer's paged attention and KV append) are not in it.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphc.modules import KERNEL_KNOBS  # noqa: E402

ALLOCATIONS = {"aten.empty.memory_format", "aten.empty_strided.default", "aten.new_empty.default",
               "aten.empty_like.default", "aten.new_empty_strided.default"}


def count(plan_path: str, graph: str, adds: tuple[str, ...] = ()) -> tuple[int, Counter]:
    """(the simulation's launches, operator -> launches) of one graph, node/family/rung as bench_steps names it."""
    os.environ["GRAPHC_PLAN_WORKERS"] = "1"                     # trace in this process, where the counter is
    os.environ["GRAPHC_CACHE_DIR"] = tempfile.mkdtemp()         # no cached trace: every operator runs
    import graphc.layer_memo as layer_memo
    import graphc.simulate as simulate
    from graphc.passes.choose_buckets import choose_buckets
    from graphc.passes.select_backends import select_backends
    from graphc.passes.simulate_steps import simulate_steps
    from graphc.plan import load_plan
    from graphc.runtime.boot import plan_ir

    layer_memo.MEMO_ON = False                                  # every layer traced, none replayed
    seen: dict[int, Counter] = {}
    real = simulate._Recorder.__torch_dispatch__

    def counted(self, func, types, args=(), kwargs=None):
        if not simulate._view(func):
            seen.setdefault(id(self), Counter())[str(func)] += 1
        return real(self, func, types, args, kwargs)
    simulate._Recorder.__torch_dispatch__ = counted
    ir = plan_ir(load_plan(plan_path))
    backends = select_backends(ir)
    for knobs in backends.kernels.values():
        knobs.update(dict.fromkeys(adds, 1))
    acts = simulate_steps(ir, choose_buckets(ir), backends)
    graphs = {f"{n}/{f}/{r}": trace for (n, f, r), (_, trace) in acts.graphs.items()}
    if graph not in graphs:
        sys.exit(f"launch_ops: no graph {graph}; the plan's: {', '.join(sorted(graphs))}")
    total = graphs[graph].launches
    matches = [c for c in seen.values() if sum(c.values()) == total]
    if not matches:
        sys.exit(f"launch_ops: no traced step of {graph} counts its {total} launches")
    return total, matches[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan")
    ap.add_argument("graph", help="node/family/rung, e.g. talker/decode:seqs/1")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--with", dest="adds", nargs="*", default=[], choices=KERNEL_KNOBS, help="a knob on every node")
    a = ap.parse_args()
    total, ops = count(a.plan, a.graph, tuple(a.adds))
    allocs = sum(n for op, n in ops.items() if op in ALLOCATIONS)
    print(f"{a.graph}: {total} launches in the simulation, {allocs} of them allocations (no kernel in a graph), "
          f"{total - allocs} operators that run kernels")
    for op, n in [(op, n) for op, n in ops.most_common() if op not in ALLOCATIONS][:a.top]:
        print(f"{n:7d}  {op}")


if __name__ == "__main__":
    main()
