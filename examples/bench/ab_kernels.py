"""A/B of the plan's kernel choices inside the captured steps: a plan's devices booted with the
plan's choices, with one or more knobs taken away on every node, with all taken away, and with the plan's
again, one after the other on one GPU, each boot in a process of its own (so the next boot finds the card
empty; each device capped to its card), each captured
graph prepared and timed as examples/bench/bench_steps.py does (its rung's inputs with random token ids and its
attention planned: bench_steps.prepare; --sampled: the talker's default sampling; CUDA events, median of
replays after warm-up).

    python examples/bench/ab_kernels.py OUT.json [--plan plans/omni_2gpu.plan] [--without fused_norms ...]
        [--with gdn_slots gemm_rows=16 ...] [--together] [--drop KNOB ..] [--none] [--no-again] [--sampled] [--devices 1] [--graphs thinker/decode:seqs/1 ...]

--with KNOB[=N]: a variant with the knob set to N (1 unless given) on every node (where a module declares it: a kernel no plan
chooses yet, e.g. gdn_slots on plans/qwen3_5_9b_h200.plan); with two or more, one more with all of them
(--together: that one alone). --drop KNOB: taken away in every variant.

Without --graphs: each device's decode graphs at 1, 16 and the largest rung, and the thinker's prefill at
128 and 2048 tokens where the plan captures them. A boot captures only the graphs it times (their warm-up and
capture are most of a boot of a full plan's 127 graphs); --capture-all captures every planned graph, as
`graphc run` does. Prints a row per graph and variant; OUT.json holds them. --profile: each timed graph's
replays under torch.profiler too, after every timing of its boot (bench_steps.profile_graph: kernels by name,
launches and GPU us a replay); the top ones printed, all in OUT's sibling OUT_profiles.json.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "bench")]

import torch  # noqa: E402

from bench_steps import kernel_lines, knob_setting, prepare, profile_graph, time_graph  # noqa: E402
from graphc.modules import KERNEL_KNOBS  # noqa: E402
from graphc.plan import load_plan  # noqa: E402
from graphc.runtime.boot import boot_plan  # noqa: E402


def default_graphs(order: list[str]) -> list[str]:
    """Decode at 1, 16 and the largest rung; the thinker's text prefill at 128 and 2048 tokens."""
    out = []
    decode: dict[str, list[int]] = {}
    for g in order:
        node, fam, rung = g.split("/")
        if fam == "decode:seqs":
            decode.setdefault(node, []).append(int(rung))
        if node == "thinker" and fam == "prefill:tokens" and rung in ("128", "2048"):
            out.append(g)
    for node, rungs in decode.items():
        out += [f"{node}/decode:seqs/{r}" for r in sorted({1, 16, max(rungs)} & set(rungs))]
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--plan", default=str(ROOT / "plans" / "omni_2gpu.plan"))
    ap.add_argument("--without", nargs="*", default=[], choices=KERNEL_KNOBS, help="a variant without each knob")
    ap.add_argument("--with", dest="adds", nargs="*", default=[], type=knob_setting, metavar="KNOB[=N]",
                    help="a variant with each knob set to N (1 unless given)")
    ap.add_argument("--graphs", nargs="*", help="the captured graphs to time (default: see above)")
    ap.add_argument("--devices", nargs="*", type=int, help="the plan devices to boot (default: all)")
    ap.add_argument("--together", action="store_true", help="of the --with knobs, only the variant with all of them")
    ap.add_argument("--drop", nargs="*", default=[], choices=KERNEL_KNOBS,
                    help="knobs taken away in every variant, the plan's own included (e.g. moe_sm90_from, whose "
                         "kernels a decode step never runs, where their package is not installed)")
    ap.add_argument("--none", action="store_true", help="a variant with every knob taken away too")
    ap.add_argument("--no-again", action="store_true", help="no second boot with the plan's kernels at the end")
    ap.add_argument("--sampled", action="store_true", help="the talker's default sampling in its rows (bench_steps)")
    ap.add_argument("--capture-all", action="store_true", help="capture every planned graph, not only the timed")
    ap.add_argument("--profile", action="store_true", help="also profile each timed graph: kernels by name, "
                    "to OUT_profiles.json")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--replays", type=int, default=30)
    a = ap.parse_args()
    variants = ([("plan", set(), {})] + [(f"without {k}", {k}, {}) for k in a.without]
                + ([] if a.together else [(f"with {_named(k, v)}", set(), {k: v}) for k, v in a.adds])
                + ([(f"with {' + '.join(_named(k, v) for k, v in a.adds)}", set(), dict(a.adds))]
                   if len(a.adds) > 1 else [])
                + ([("none", set(KERNEL_KNOBS), {})] if a.none else [])
                + ([] if a.no_again else [("plan again", set(), {})]))
    out: dict[str, float] = {}
    profiles: dict[str, dict] = {}
    for dev in load_plan(a.plan).devices:
        if a.devices is not None and dev.index not in a.devices:
            continue
        graphs = [g for g in (a.graphs or default_graphs(dev.capture_order)) if g in dev.capture_order]
        if not graphs:
            continue
        for name, drop, add in variants:
            changes = (f"{' without ' + ', '.join(sorted(drop)) if drop else ''}"
                       f"{' with ' + ', '.join(sorted(add)) if add else ''}")
            print(f"device {dev.index}: booting with the plan's kernels{changes}", flush=True)
            with mp.get_context("spawn").Pool(1) as pool:      # a fresh process: the last boot's memory is gone
                rows, profs = pool.apply(time_variant, (a.plan, dev.index, drop | set(a.drop), add, graphs,
                                                        a.sampled, a.warmup, a.replays, a.capture_all, a.profile))
            for g, ms in rows.items():
                out[f"{g} {name}"] = ms
                print(f"{g:40s} {name:24s} {ms:8.3f} ms", flush=True)
            for g, prof in profs.items():
                profiles[f"{g} {name}"] = prof
                print_profile(f"{g} {name}", prof)
            Path(a.out).write_text(json.dumps(out, indent=1))      # as it goes: a run cut short keeps its rows
            if profiles:
                Path(a.out).with_name(Path(a.out).stem + "_profiles.json").write_text(json.dumps(profiles, indent=1))


def print_profile(what: str, prof: dict, top: int = 15) -> None:
    print(f"  profile of {what}: {prof['launches']:.0f} kernels, {prof['kernel_us'] / 1e3:.3f} ms kernel time a "
          "replay; top:", flush=True)
    print("\n".join(kernel_lines(prof, top)), flush=True)


def _named(knob: str, value: int) -> str:
    """A variant's name for a knob set: the knob alone at 1, else knob=N."""
    return knob if value == 1 else f"{knob}={value}"


def time_variant(path: str, index: int, drop: set[str], add: dict[str, int], graphs: list[str], sampled: bool,
                 warmup: int, replays: int, capture_all: bool = False, profile: bool = False) -> tuple[dict, dict]:
    """Boot one plan device with its nodes' knobs changed (and, unless capture_all, only the graphs to time
    captured) and time each graph: {graph: ms}; then, with `profile`, each one's kernels ({graph: profile},
    after every timing: a replay timed after a profile in the process can be slower)."""
    plan = load_plan(path)
    for k, n in list(plan.nodes.items()):
        kept = {x: v for x, v in n.kernels.items() if x not in drop}
        plan.nodes[k] = n.model_copy(update={"kernels": kept | add})
    for i, d in enumerate(plan.devices):
        if d.index == index and not capture_all:
            plan.devices[i] = d.model_copy(update={"capture_order": [g for g in d.capture_order if g in graphs]})
    (boot,) = boot_plan(plan, devices=[index], emulate=True)
    rows = {}
    with torch.inference_mode():
        for g in graphs:
            prepare(boot, g, sampled)    # its rung's inputs (random ids) and attention plan
            rows[g] = time_graph(boot.graphs[g], warmup, replays)
        profs = {}
        for g in graphs if profile else []:
            prepare(boot, g, sampled)
            profs[g] = profile_graph(boot.graphs[g], replays)
    return rows, profs

if __name__ == "__main__":
    main()
