"""Boot plans on this GPU, each capped to its plan's card, and collect `graphc check` for each.

    python examples/tools/boot_plans.py --out DIR [--deadline S] [--export-kernels] [--kernels DIR] PLAN[:DEVICE] ...

1. --kernels DIR: FlashInfer modules built on an earlier machine (the parts --export-kernels wrote)
   are unpacked where FlashInfer looks for prebuilt modules, so nothing is compiled again.
2. The kernel jobs of every listed plan are compiled together, in parallel (graphc.runtime.kernels).
3. --export-kernels: the built modules go to DIR as kernels.tar.xz.NN parts of 15 MiB.
4. Each PLAN[:DEVICE] runs `graphc check PLAN [--device N] --emulate --no-prebuild --json` in its own
   process (a fresh CUDA context and memory cap each), in the order given; one that could not
   finish before --deadline seconds from the start is not started. Its text goes to DIR/checks.log,
   and every check's JSON, with its wall time and exit code, to DIR/checks.json.

Prints one line per boot: graphs captured of planned, measured peak against planned.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphc.plan import load_plan  # noqa: E402
from graphc.runtime.boot import plan_ir  # noqa: E402
from graphc.runtime.kernels import distinct, kernel_jobs, warm  # noqa: E402


def flashinfer_dirs() -> tuple[Path, Path]:
    """(where FlashInfer looks for prebuilt modules, where it JIT-builds them)."""
    from flashinfer.jit import env

    return env.FLASHINFER_AOT_DIR, env.FLASHINFER_JIT_DIR


def install_kernels(src: str) -> int:
    parts = sorted(glob.glob(os.path.join(src, "kernels.tar.xz.*")))
    if not parts:
        return 0
    aot, _ = flashinfer_dirs()
    aot.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        whole = Path(tmp) / "kernels.tar.xz"
        with open(whole, "wb") as f:
            for p in parts:
                f.write(Path(p).read_bytes())
        with tarfile.open(whole) as tar:
            names = [m.name for m in tar.getmembers() if m.name.endswith(".so")]
            tar.extractall(aot, filter="data")
    return len(names)


def export_kernels(out: Path, part_bytes: int = 15 * 2**20) -> list[str]:
    """Every module built here, as <name>/<name>.so, compressed and split into parts."""
    _, jit = flashinfer_dirs()
    sos = sorted(p for p in jit.glob("*/*.so") if p.parent.name == p.stem)
    whole = out / "kernels.tar.xz"
    subprocess.run(["tar", "-cf", str(whole), "-I", "xz -T0 -6", "-C", str(jit),
                    *[f"{p.parent.name}/{p.name}" for p in sos]], check=True)
    data = whole.read_bytes()
    whole.unlink()
    names = []
    for i in range(0, len(data), part_bytes):
        name = out / f"kernels.tar.xz.{i // part_bytes:02d}"
        name.write_bytes(data[i:i + part_bytes])
        names.append(name.name)
    print(f"exported {len(sos)} modules ({sum(p.stat().st_size for p in sos) / 2**20:.0f} MiB, "
          f"{len(data) / 2**20:.1f} MiB compressed): {', '.join(p.stem for p in sos)}", flush=True)
    return names


def parse_target(arg: str) -> tuple[str, int | None]:
    path, _, dev = arg.partition(":")
    if dev and not dev.isdigit():
        raise argparse.ArgumentTypeError(f"'{arg}': the part after ':' is a plan device index (e.g. {path}:1)")
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"'{path}' is not a plan file")
    return path, int(dev) if dev else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("targets", nargs="+", metavar="PLAN[:DEVICE]", type=parse_target)
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, default=540, help="seconds from start after which no boot starts")
    ap.add_argument("--estimate", type=float, default=60, help="seconds a boot is assumed to need at least")
    ap.add_argument("--kernels", default=None, help="folder of kernels.tar.xz.NN parts to install first")
    ap.add_argument("--export-kernels", action="store_true")
    args = ap.parse_args()
    start, out = time.perf_counter(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.kernels:
        print(f"installed {install_kernels(args.kernels)} prebuilt modules", flush=True)

    targets = args.targets
    jobs = []
    for path, dev in targets:
        plan = load_plan(path)
        jobs += kernel_jobs(plan, plan_ir(plan), [dev] if dev is not None else list(range(len(plan.devices))))
    jobs = distinct(jobs)
    built = warm(jobs)
    print(f"kernels: {len(jobs)} jobs in {time.perf_counter() - start:.0f} s: "
          + ", ".join(f"{k} {v:.0f} s" for k, v in built.items()), flush=True)
    if args.export_kernels:
        export_kernels(out)

    results, log = [], open(out / "checks.log", "w")
    for path, dev in targets:
        left = args.deadline - (time.perf_counter() - start)
        name = f"{path}" + (f":{dev}" if dev is not None else "")
        if left < args.estimate:
            print(f"{name}: not started, {left:.0f} s left before the deadline", flush=True)
            results.append({"target": name, "skipped": True})
            continue
        js = out / "one_check.json"
        cmd = [sys.executable, "-m", "graphc.cli", "check", path, "--emulate", "--no-prebuild", "--json", str(js)]
        cmd += ["--device", str(dev)] if dev is not None else []
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=left)
            rc, text = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as e:
            rc, text = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        wall = time.perf_counter() - t0
        log.write(f"==== {' '.join(cmd)}\n(exit {rc}, {wall:.0f} s)\n{text}\n")
        log.flush()
        check = json.loads(js.read_text()) if js.exists() and rc in (0, 1) else None
        js.unlink(missing_ok=True)
        results.append({"target": name, "exit": rc, "wall_s": round(wall, 1), "check": check})
        if check:
            for c in check["checks"]:
                got, planned = c["measured_total"], c["planned_total"]
                peak = ("no device peak (a CPU plan runs its steps eagerly)" if got is None else
                        f"peak {got / 2**30:.2f} GiB of planned {planned / 2**30:.2f} GiB "
                        f"({100 * (got - planned) / planned:+.2f}%)")
                print(f"{name} device {c['index']}: exit {rc}, {wall:.0f} s, graphs "
                      f"{len(c['graphs_captured'])}/{len(c['graphs_planned'])}, {peak}", flush=True)
        else:
            print(f"{name}: exit {rc} after {wall:.0f} s\n{text[-4000:]}", flush=True)
        (out / "checks.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r.get("exit") == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
