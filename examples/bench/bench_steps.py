"""Time every captured graph of a plan device on its GPU: ms per replay, tokens (or units) per second,
kernel launches per step and per layer (the compiler's simulation counts them; a layer is one block of
the node's longest stack), and the step's memory-bandwidth floor.

    python examples/bench/bench_steps.py plans/omni_2gpu.plan --device 1 --emulate --json OUT.json
    python examples/bench/bench_steps.py PLAN --only thinker/decode:seqs --replays 30

Each graph replays on the boot's synthetic layout of its rung (decode rows sit after a short history;
greedy talker rows, or with --sampled the talker's default sampling: sample_rows), with random token ids in place of the layout's zeros (vary_tokens: identical rows would all route to the
same experts), after --warmup replays, timed with CUDA events over --replays replays (the median of
per-replay times).

The floor is the bytes one step must read at --bandwidth (default 4.26 TB/s, the H200's measured
device copy rate): every parameter of the node, except that a sparse MoE layer reads only the experts its
tokens touch, E x (1 - (1 - k/E)^T) of E for T tokens routed to k of E each (the expected count for
uniform routing), each of which is read once, and an embedding table only its T rows; plus, for a node
with linear-attention state slots (Qwen3.5), each sequence's state read once and written once (the plan's
slot_bytes x the rung's sequences x 2). KV pages are not counted (the synthetic history is short). It is a
memory floor only: compute-bound steps (prefill of many tokens, the encoders, Code2Wav) sit far above it.

`--profile GRAPH ...` (ids or prefixes, as --only) also records those graphs' replays under torch.profiler
and writes each one's kernels to the JSON (name, launches and GPU microseconds per replay, by total time),
with the sum of kernel time against the replay's wall time (the rest is gaps between kernels). Profiles run
after every graph is timed (a replay timed after a profile in the same process can be slower), and each
profiled graph is timed once more after its profile (ms_after_profile in the JSON).

`--floors-from JSON` prints the table of an earlier run with floors recomputed on this machine (no GPU:
the node modules are built on the meta device).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from graphc.plan import load_plan, parse_graph_id  # noqa: E402


def launches_per_graph(ir) -> dict[str, int]:
    """node/family/rung -> kernel launches, from the compiler's simulation of the same steps."""
    from graphc.passes.choose_buckets import choose_buckets
    from graphc.passes.select_backends import select_backends
    from graphc.passes.simulate_steps import simulate_steps

    acts = simulate_steps(ir, choose_buckets(ir), select_backends(ir))
    return {f"{n}/{f}/{r}": trace.launches for (n, f, r), (_, trace) in acts.graphs.items()}


def moe_blocks(module: torch.nn.Module) -> list[tuple[int, int, int]]:
    """(expert bytes, num_experts, top_k) of each sparse MoE block in the module."""
    from models.components.moe import SparseMoE

    out = []
    for m in module.modules():
        if isinstance(m, SparseMoE):
            e = m.experts
            nbytes = sum(p.numel() * p.element_size() for p in (e.gate_up_proj, e.down_proj))
            out.append((nbytes, e.num_experts, m.top_k))
    return out


def num_layers(module: torch.nn.Module) -> int | None:
    """The node's layers: its longest stack of repeated blocks (a ModuleList), None without one."""
    stacks = [len(m) for m in module.modules() if isinstance(m, torch.nn.ModuleList) and len(m) >= 3]
    return max(stacks, default=None)


def floor_bytes(module: torch.nn.Module, tokens: int) -> int:
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    linear = {id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Linear)}
    for m in module.modules():          # an embedding table is read at its T rows (unless a tied head reads it all)
        if isinstance(m, torch.nn.Embedding) and id(m.weight) not in linear:
            w = m.weight
            total -= (w.shape[0] - min(tokens, w.shape[0])) * w[0].numel() * w.element_size()
    for nbytes, experts, k in moe_blocks(module):
        touched = experts * (1 - (1 - k / experts) ** tokens)
        total -= nbytes - round(nbytes * touched / experts)
    return total


def state_bytes(plan, node: str, seqs: int) -> int:
    """The state a step of `seqs` sequences reads and writes back: every linear_state resource of the node,
    its slot_bytes (one sequence in every layer) per sequence, twice."""
    slots = [plan.resources[r] for r in plan.nodes[node].resources.values() if plan.resources[r].slot_bytes]
    return 2 * seqs * sum(r.slot_bytes for r in slots)


def vary_tokens(boot, seed: int = 0, only: tuple[str, str] | None = None) -> list[str]:
    """Random token ids in every captured graph's static token_ids input (the boot's synthetic layout
    gives zeros: every row the same token, so a sparse MoE layer routes all rows to the same k experts and
    a decode step of many sequences reads only k experts a layer, where real rows touch up to all E).
    The ids are drawn below the node's embedding rows; the nodes varied are returned. only: one
    (node, family)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    varied = []
    for (node, family), bufs in boot.runtime.io.items():
        if only is not None and (node, family) != only:
            continue
        buf = bufs.get("in.token_ids")
        emb = next((m for m in boot.modules[node].modules() if isinstance(m, torch.nn.Embedding)), None)
        if buf is None or emb is None:
            continue
        buf.copy_(torch.randint(0, emb.num_embeddings, buf.shape, generator=gen, dtype=buf.dtype))
        varied.append(f"{node}/{family}")
    torch.cuda.synchronize()
    return varied


def sample_rows(boot, only: tuple[str, str] | None = None) -> list[str]:
    """The talker's default sampling (models/components/speech_host.py: temperature 0.9, top-k 50, repetition
    penalty 1.05 for code 0; top-k 50 and top-p 0.8 for the residual codes) in every captured graph's static
    `sampling` rows and Exp(1) draws in its `noise`, in place of the layout's zeros (greedy rows, which skip
    the sampler's filters). The nodes set are returned."""
    from models.components.speech_host import RESIDUAL_SAMPLING, TALKER_SAMPLING as t
    from models.components.talker import sampling_row

    row = sampling_row(t.temperature, t.top_k, t.top_p, t.repetition_penalty, **RESIDUAL_SAMPLING)
    gen = torch.Generator(device="cpu").manual_seed(1)
    done = []
    for (node, family), bufs in boot.runtime.io.items():
        if (only is not None and (node, family) != only) or "in.sampling" not in bufs:
            continue
        buf = bufs["in.sampling"]                  # the rung's rows, flat
        buf.copy_(torch.tensor(row, dtype=buf.dtype).repeat(buf.numel() // len(row)))
        if "in.noise" in bufs:
            n = bufs["in.noise"]
            n.copy_(torch.empty(n.shape, dtype=n.dtype).exponential_(generator=gen))
        done.append(f"{node}/{family}")
    torch.cuda.synchronize()
    return done


def knob_setting(text: str) -> tuple[str, int]:
    """An argparse type: KNOB or KNOB=N, a kernel knob (graphc.modules.KERNEL_KNOBS) and its value (1 unless given;
    e.g. gemm_rows=16, the most rows its kernel takes)."""
    from graphc.modules import KERNEL_KNOBS

    name, eq, value = text.partition("=")
    if name not in KERNEL_KNOBS:
        raise argparse.ArgumentTypeError(f"{name!r} is not a kernel knob; knobs: {', '.join(KERNEL_KNOBS)}")
    if eq and not value.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: a knob's value is a whole number >= 0 (KNOB or KNOB=N)")
    return name, int(value) if eq else 1


def set_knobs(plan, settings: dict[str, int]) -> None:
    """Set kernel knobs on every node of a plan loaded for a benchmark, in place (a module that does not
    declare one ignores it)."""
    for k, n in list(plan.nodes.items()):
        plan.nodes[k] = n.model_copy(update={"kernels": n.kernels | settings})


def drop_kernels(plan, knobs) -> None:
    """Take kernel knobs away on every node of a plan loaded for a benchmark, in place (e.g. moe_sm90_from, whose
    package, nvidia-cutlass-dsl, the GPU image lacks)."""
    for k, n in list(plan.nodes.items()):
        plan.nodes[k] = n.model_copy(update={"kernels": {x: v for x, v in n.kernels.items() if x not in knobs}})


def prepare(boot, key: str, sampled: bool = False):
    """Make graph `key` ready to replay on its rung: the boot's synthetic layout in its static inputs, random
    token ids (vary_tokens), the talker's sampling where asked (sample_rows), and its attention wrappers
    planned for this rung (a replay reads the last plan; the boot leaves each family planned at its last
    captured rung). Returns the family's step."""
    g = boot.runtime
    node, family, rung = parse_graph_id(key)
    step = boot.ir.family(node, family)
    g.static_inputs(node, family, step, rung)
    vary_tokens(boot, only=(node, family))        # the layout's zeros replaced
    if sampled:
        sample_rows(boot, only=(node, family))
    g.plan_step(g.backends[(node, family, rung)], step, rung)
    return step


def picked(key: str, patterns: list[str] | None) -> bool:
    """Whether graph `key` (node/family/rung) is one of patterns: a graph id, or a node or node/family prefix."""
    return any(key == o or key.startswith(o + "/") or key.split("/")[0] == o for o in patterns or ())


def time_graph(graph, warmup: int, replays: int) -> float:
    for _ in range(warmup):
        graph.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def profile_graph(graph, replays: int) -> dict:
    """Kernels of `replays` replays of a captured graph, grouped by name: per replay, launches and GPU us."""
    from torch.profiler import ProfilerActivity, profile

    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name, [0, 0.0])
            k[0] += 1
            k[1] += e.device_time
    rows = sorted(({"kernel": n, "launches": c / replays, "us": t / replays} for n, (c, t) in kernels.items()),
                  key=lambda r: -r["us"])
    return {"replays": replays, "kernel_us": sum(r["us"] for r in rows),
            "launches": sum(r["launches"] for r in rows), "kernels": rows}


def kernel_lines(prof: dict, top: int = 12) -> list[str]:
    """A profile_graph result's top kernels, a line each: GPU us and launches a replay, the kernel's name."""
    return [f"    {r['us']:9.1f} us {r['launches']:6.0f}x  {r['kernel'][:110]}" for r in prof["kernels"][:top]]


def time_row(boot, plan, key: str, a, launches: dict, layers: dict) -> dict:
    """Graph `key` timed, with its launches and its floor; printed as a line of the table."""
    node, family, rung = parse_graph_id(key)
    step = prepare(boot, key, a.sampled)
    ms = time_graph(boot.graphs[key], a.warmup, a.replays)
    per_layer = launches[key] / layers[node] if launches.get(key) and layers.get(node) else None
    sizes = step.sizes_at(rung)
    state = state_bytes(plan, node, sizes.get("seqs", 0))
    floor = (floor_bytes(boot.modules[node], sizes.get("tokens", rung)) + state) / a.bandwidth * 1e3
    print(f"{key:48s} {ms:8.3f} ms  {rung / ms * 1e3:12,.0f} {step.axis}/s  "
          f"launches {launches.get(key, '-')!s:>6} ({'-' if per_layer is None else f'{per_layer:.1f}'} a layer)"
          f"  floor {floor:7.3f} ms  x{ms / floor:5.1f}", flush=True)
    return {"graph": key, "node": node, "family": family, "rung": rung, "axis": step.axis, "ms": ms,
            "units_per_s": rung / ms * 1e3, "launches": launches.get(key), "launches_per_layer": per_layer,
            "state_bytes": state, "floor_ms": floor, "ratio": ms / floor if floor else None, "profile": None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan", nargs="?", help="the plan (not needed with --floors-from)")
    ap.add_argument("--device", type=int, default=0, help="the plan device to boot (default 0)")
    ap.add_argument("--emulate", action="store_true", help="cap this GPU to the plan's card")
    ap.add_argument("--only", nargs="+", default=None, help="NODE or NODE/FAMILY (several): time only these graphs")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--bandwidth", type=float, default=4.26e12, help="bytes per second the floor assumes")
    ap.add_argument("--no-launches", action="store_true", help="skip the simulation that counts launches")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sampled", action="store_true",
                    help="the talker's default sampling in its graphs' rows (default: the layout's greedy rows)")
    ap.add_argument("--profile", nargs="+", default=None, metavar="GRAPH",
                    help="also profile these graphs (ids or prefixes, as --only): kernels per replay, in --json")
    ap.add_argument("--floors-from", default=None, metavar="JSON", help="re-render an earlier run's table")
    a = ap.parse_args()
    if a.floors_from:
        return rerender(a.floors_from, a.bandwidth)
    if a.plan is None:
        ap.error("give a PLAN (or --floors-from JSON)")
    if not torch.cuda.is_available():
        sys.exit("bench_steps needs a CUDA device: it replays the plan's captured graphs")
    from graphc.runtime.boot import boot_plan

    plan = load_plan(a.plan)
    (boot,) = boot_plan(plan, devices=[a.device], emulate=a.emulate)
    ir = boot.ir
    print(f"random token ids in: {', '.join(vary_tokens(boot)) or 'no graph'}", flush=True)
    launches = {} if a.no_launches else launches_per_graph(ir)
    layers = {n: num_layers(m) for n, m in boot.modules.items()}
    rows = []
    with torch.inference_mode():
        for key in plan.devices[a.device].capture_order:
            if a.only and not picked(key, a.only):
                continue
            rows.append(time_row(boot, plan, key, a, launches, layers))
        # profiles after every timing: a replay timed after torch.profiler has recorded CUDA activity in the process
        # can be slower (a talker frame timed after a thinker graph's profile: 4.55 ms, where it had taken 3.89 and
        # its kernels the same 3.45 ms), so each profiled graph is timed again after its profile (ms_after_profile)
        for row in rows:
            key = row["graph"]
            if picked(key, a.profile):
                prepare(boot, key, a.sampled)
                row["profile"] = prof = profile_graph(boot.graphs[key], a.replays)
                row["ms_after_profile"] = time_graph(boot.graphs[key], a.warmup, a.replays)
                print(f"  profile of {key}: {prof['launches']:.0f} kernels, {prof['kernel_us'] / 1e3:.3f} ms kernel "
                      f"time in a {row['ms']:.3f} ms replay ({row['ms_after_profile']:.3f} ms timed again after the "
                      "profile); top:", flush=True)
                print("\n".join(kernel_lines(prof)), flush=True)
    info = {"plan": a.plan, "device": a.device, "sampled": a.sampled, "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "replays": a.replays, "warmup": a.warmup, "bandwidth": a.bandwidth, "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(info, indent=1))


def rerender(path: str, bandwidth: float) -> None:
    """A markdown table of a saved run, floors recomputed from meta modules of the plan's nodes."""
    from graphc.runtime.boot import plan_ir
    from graphc.runtime.build import build_shell

    info = json.loads(Path(path).read_text())
    plan = load_plan(info["plan"])
    ir = plan_ir(plan)
    shells: dict[str, torch.nn.Module] = {}
    layers: dict[str, int | None] = {}
    print("| graph | ms | units/s | launches | a layer | floor ms | x floor |\n|---|---|---|---|---|---|---|")
    for r in info["rows"]:
        if r["node"] not in shells:
            shells[r["node"]] = build_shell(ir.node(r["node"]))
        sizes = ir.family(r["node"], r["family"]).sizes_at(r["rung"])
        state = state_bytes(plan, r["node"], sizes.get("seqs", 0))
        floor = (floor_bytes(shells[r["node"]], sizes.get("tokens", r["rung"])) + state) / bandwidth * 1e3
        if r["node"] not in layers:
            layers[r["node"]] = num_layers(shells[r["node"]])
        per = r["launches"] / layers[r["node"]] if r.get("launches") and layers[r["node"]] else None
        print(f"| {r['graph']} | {r['ms']:.2f} | {r['units_per_s']:,.0f} {r['axis']} | {r['launches'] or '-'} | "
              f"{'-' if per is None else f'{per:.1f}'} | {floor:.3f} | {r['ms'] / floor:.1f} |")


if __name__ == "__main__":
    main()
