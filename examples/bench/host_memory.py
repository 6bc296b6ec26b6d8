"""Host memory of one GPU worker, phase by phase: what a booted plan device holds in this host's memory
(resident, anonymous, file-backed, page-locked) after CUDA starts, after its weights are in, after its
wrappers are built, after capture, and after serving; with the peak of the weights' load.

    python examples/bench/host_memory.py plans/qwen3_5_9b_h200.plan --json $OUT/host.json   # seeded weights
    python examples/bench/host_memory.py PLAN --write-checkpoint $CKPT     # seeded weights to safetensors, then
    python examples/bench/host_memory.py PLAN --checkpoint $CKPT --json OUT  # boot from them (a fresh process)

Resident figures are /proc/self/status (VmRSS, VmHWM, RssAnon, RssFile, RssShmem); page-locked figures
are torch's pinned host allocator (torch.cuda.host_memory_stats). Each phase also records the plan's host
lines for the device, so the JSON holds planned against measured. One process per run: the peak is its own.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")


def status() -> dict[str, int]:
    """This process's resident set from /proc/self/status, in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in FIELDS:
            out[key] = int(rest.split()[0]) * 1024
    return out


def pinned() -> dict[str, int]:
    import torch

    if not torch.cuda.is_initialized():
        return {"pinned": 0, "pinned_peak": 0, "pinned_blocks": 0}
    s = torch.cuda.host_memory_stats()
    return {"pinned": s.get("allocated_bytes.current", 0), "pinned_peak": s.get("allocated_bytes.peak", 0),
            "pinned_blocks": s.get("allocations.current", 0)}


class Phases:
    """Marks at phases, and a sampler every 5 ms for the peak of what is not file-backed (anonymous and shared:
    page-locked memory is shared): file pages (the checkpoint's, mapped while read) are page cache the kernel
    takes back under pressure, and VmHWM counts them."""

    def __init__(self):
        self.rows: list[dict] = []
        self.t0 = time.perf_counter()
        self.peak_resident = 0
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            st = status()
            self.peak_resident = max(self.peak_resident, st["RssAnon"] + st["RssShmem"])
            time.sleep(0.005)

    def mark(self, name: str) -> None:
        row = {"phase": name, "s": round(time.perf_counter() - self.t0, 1), **status(), **pinned(),
               "peak_anon_shmem": self.peak_resident}
        self.rows.append(row)
        print(f"{name:>22}: rss {row['VmRSS'] / 2**20:8.0f} MiB  anon {row['RssAnon'] / 2**20:8.0f}  "
              f"peak anon+shm {row['peak_anon_shmem'] / 2**20:6.0f}  "
              f"file {row['RssFile'] / 2**20:7.0f}  hwm {row['VmHWM'] / 2**20:8.0f}  "
              f"pinned {row['pinned'] / 2**20:7.0f} MiB ({row['pinned_blocks']} blocks)", flush=True)


def hook(phases: Phases) -> None:
    """Marks inside the boot: after the weights and pools, after the wrappers, after capture."""
    from graphc.runtime import gpu

    def after(fn, name):
        def wrapped(*a, **k):
            out = fn(*a, **k)
            phases.mark(name)
            return out
        return wrapped
    gpu.allocate = after(gpu.allocate, "weights and pools")
    gpu.Graphs.allocate_wrappers = after(gpu.Graphs.allocate_wrappers, "wrappers")
    gpu.Graphs.capture_all = after(gpu.Graphs.capture_all, "captured")
    gpu.Graphs.run_eager = after(gpu.Graphs.run_eager, "eager steps run")


def write_checkpoint(plan_path: str, out: Path) -> None:
    """Seeded weights of every node of the plan, saved under their on-disk names (one file per node)."""
    import torch
    from safetensors.torch import save_file

    from graphc.plan import load_plan
    from graphc.runtime.boot import plan_ir
    from graphc.runtime.build import fill_seeded, materialize

    plan = load_plan(plan_path)
    ir = plan_ir(plan)
    out.mkdir(parents=True, exist_ok=True)
    for name in plan.nodes:
        node = ir.node(name)
        module, _ = materialize(node, torch.device("cuda"))
        fill_seeded(module, 0)
        state, seen = {}, set()
        for k, v in module.state_dict().items():      # a tied tensor once, under its first name (as HF saves it)
            if v.data_ptr() not in seen:
                seen.add(v.data_ptr())
                state[node.weight_prefix + k] = v.detach().cpu().contiguous()
        save_file(state, str(out / f"{name}.safetensors"))
        print(f"{name}: {len(state)} tensors, {sum(v.nbytes for v in state.values()) / 2**30:.2f} GiB", flush=True)
        del module, state
        torch.cuda.empty_cache()


def serve(engine, requests: int, prompt: int, tokens: int) -> None:
    from examples.bench.bench_engine import prompt_ids
    from graphc.runtime.sampler import SamplingParams

    import numpy as np

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    for ids in prompt_ids(engine, requests, prompt, np.random.default_rng(0)):
        engine.add(prompt_token_ids=ids, params=params)
    while engine.has_work():
        engine.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan")
    ap.add_argument("--checkpoint", default=None, help="safetensors folder (default: seeded weights)")
    ap.add_argument("--emulate", action="store_true", help="boot a plan for another card of the same arch")
    ap.add_argument("--write-checkpoint", default=None, metavar="DIR")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.write_checkpoint:
        write_checkpoint(args.plan, Path(args.write_checkpoint))
        return
    phases = Phases()
    phases.mark("python and torch")
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    phases.mark("cuda context")
    hook(phases)
    from graphc.runtime.engine import Engine

    from graphc.plan import load_plan
    from graphc.runtime.boot import boot_plan

    plan = load_plan(args.plan)       # booted here, so a checkpoint needs no config.json for the engine's checks
    boot = boot_plan(plan, checkpoint=args.checkpoint, emulate=args.emulate)[0]
    engine = Engine(plan, random_weights=True, boot=boot)
    phases.mark("engine booted")
    serve(engine, args.requests, args.prompt, args.tokens)
    phases.mark(f"served {args.requests}")
    planned = dict(engine.plan.devices[0].host)
    last = phases.rows[-1]
    measured = {"pinned": last["pinned_peak"], "VmHWM": last["VmHWM"], "anon_shmem": phases.peak_resident}
    total = max(sum(planned.values()), 1)
    print(f"planned: {', '.join(f'{k} {v / 2**20:.0f} MiB' for k, v in planned.items())}; total {total / 2**20:.0f} MiB")
    print(f"measured: page-locked peak {measured['pinned'] / 2**20:.0f} MiB; peak anonymous + shared "
          f"{measured['anon_shmem'] / 2**20:.0f} MiB ({measured['anon_shmem'] / total:.1%} of the planned total); "
          f"VmHWM {measured['VmHWM'] / 2**20:.0f} MiB ({measured['VmHWM'] / total:.1%}, file pages included)")
    result = {"plan": args.plan, "checkpoint": args.checkpoint, "phases": phases.rows, "planned": planned, "measured": measured,
              "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
