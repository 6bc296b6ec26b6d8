"""Measure cuDNN's workspace for every convolution a set of plans captures (graphc/convws.py).

    python examples/tools/calibrate_convs.py list PLAN ... > docs/data/conv_signatures.txt   # any machine
    python examples/tools/calibrate_convs.py measure docs/data/conv_signatures.txt --out FILE  # on the GPU

`list` traces the plans' steps as the compiler does and prints each distinct convolution
signature. `measure` runs each one through torch (aten.convolution, bf16, on cuda:0) twice: the
first call lets cuDNN choose its engine, the second runs the cached engine as a captured step
would, and its peak allocation less the output is the workspace. FILE is written in the format of
graphc/conv_workspaces.yaml, with the device, date and versions.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

def list_signatures(plans: list[str]) -> list[str]:
    from graphc.passes.choose_buckets import choose_buckets
    from graphc.passes.select_backends import select_backends
    from graphc.passes.simulate_steps import simulate_steps
    from graphc.plan import load_plan
    from graphc.runtime.boot import plan_ir

    sigs: set[str] = set()
    for path in plans:
        plan = load_plan(path)
        ir = plan_ir(plan)
        backends = select_backends(ir)
        acts = simulate_steps(ir, choose_buckets(ir), backends)
        traces = [t for _, t in acts.graphs.values()] + list(acts.eager.values())
        sigs |= {sig for t in traces for _, sig in t.convs}
    return sorted(sigs)


def measure_one(sig: str) -> int:
    """The second call's peak allocation less its output: the cached engine's workspace."""
    import torch

    from graphc.convws import convolution

    run = convolution(sig, torch.device("cuda", 0))
    first = run()                      # cuDNN chooses its engine here
    del first
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    y = run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base - y.untyped_storage().nbytes()


def measure(sig_file: str, out: str) -> None:
    import torch
    import yaml
    from tqdm import tqdm

    sigs = [line.strip() for line in Path(sig_file).read_text().splitlines() if line.strip()]
    found = {}
    for sig in tqdm(sigs, desc="measuring convolutions", unit="conv", file=sys.stderr):
        found[sig] = measure_one(sig)
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    entry = {"measured": {
        "device": torch.cuda.get_device_name(0),
        "date": datetime.date.today().isoformat(),
        "versions": f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}",
        "how": f"examples/tools/calibrate_convs.py measure {sig_file}"},
        "workspaces": found}
    arch = f"sm_{props.major}{props.minor}"
    Path(out).write_text(yaml.safe_dump({"entries": {arch: entry}}, sort_keys=False, width=200))
    top = sorted(found.items(), key=lambda kv: -kv[1])[:8]
    print(f"{len(found)} convolutions on {arch}; {sum(1 for v in found.values() if v)} take a workspace; largest:")
    for sig, n in top:
        print(f"  {n / 2**20:10.1f} MiB  {sig}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list")
    ls.add_argument("plans", nargs="+")
    ms = sub.add_parser("measure")
    ms.add_argument("signatures")
    ms.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.cmd == "list":
        for sig in list_signatures(args.plans):
            print(sig)
    else:
        measure(args.signatures, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
