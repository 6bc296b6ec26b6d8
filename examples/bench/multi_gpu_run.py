"""A multi-device plan served on its GPUs, end to end, as a user runs it:

    python examples/bench/multi_gpu_run.py --out $OUT [--kernels .fimods] [--plan plans/omni_2gpu.plan]

1. `graphc run PLAN --random-weights --emulate --requests R --stats S` over a JSONL of a2t, i2t and t2s
   requests (examples/bench/make_requests.py; t2s speaks through the talker and Code2Wav on another device): every device boots in its own process, each checked against its
   ledger (its peak, its graphs), the requests complete, and the stats say tokens/s, TTFT and the time the
   engine spent on the other devices' node steps and in receiving their rows.
2. The same run again with a worker process killed (SIGKILL) once the requests are under way: the run must
   end within 10 s, exit 3, and name the device.

Each run is bounded (--timeout); one that outlives it gets SIGABRT first, which makes every graphc process
print its Python stacks (PYTHONFAULTHANDLER), so a hang says where it is. Writes OUT/multi_gpu.json, the
runs' logs and the stats; prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import shutil
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def workers_of(pid: int) -> list[int]:
    """The engine's worker processes (python -m graphc.runtime.workers ...)."""
    found = []
    for c in children(pid):
        try:
            cmd = Path(f"/proc/{c}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if b"graphc.runtime.workers" in cmd:
            found.append(c)
    return found


def abort_all(proc: subprocess.Popen) -> None:
    """SIGABRT to the engine and its workers (their stacks go to the log), then kill what is left."""
    for pid in [proc.pid, *workers_of(proc.pid)]:
        try:
            os.kill(pid, signal.SIGABRT)
        except ProcessLookupError:
            pass
    time.sleep(3)
    for pid in [proc.pid, *workers_of(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class GpuSampler(threading.Thread):
    """The most each process held on each GPU (nvidia-smi, every half second): which process's memory lies
    on which device, which torch cannot say from inside one process."""

    def __init__(self):
        super().__init__(daemon=True)
        self.most: dict[tuple[str, int], int] = {}
        self.stop = threading.Event()
        self.ok = shutil.which("nvidia-smi") is not None

    def run(self) -> None:
        while self.ok and not self.stop.wait(0.5):
            try:
                text = subprocess.run(["nvidia-smi", "--query-compute-apps=gpu_bus_id,pid,used_memory",
                                       "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                      timeout=10).stdout
            except subprocess.TimeoutExpired:
                continue
            for line in text.strip().splitlines():
                bus, pid, mib = [x.strip() for x in line.split(",")]
                if mib.isdigit():
                    key = (bus, int(pid))
                    self.most[key] = max(self.most.get(key, 0), int(mib))


def graphc_run(plan: str, requests: Path, out: Path, name: str, timeout: float, kill_after: float | None = None):
    """One `graphc run`; kill_after: SIGKILL its first worker that many seconds after the requests start."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN")}
    log = out / f"{name}.log"
    from graphc.plan import load_plan

    emulate = ["--emulate"] if load_plan(plan).target.arch != "cpu" else []
    cmd = [sys.executable, "-m", "graphc.cli", "run", plan, "--random-weights", *emulate,
           "--requests", str(requests), "--output", str(out / f"{name}.jsonl"), "--stats", str(out / f"{name}_stats.json")]
    print("$", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    killed = None
    sampler = GpuSampler()
    sampler.start()
    roles: dict[int, str] = {}
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        roles[proc.pid] = "engine"
        try:
            while proc.poll() is None and time.monotonic() - t0 < timeout:
                time.sleep(0.2)
                roles |= {w: "worker" for w in workers_of(proc.pid)}
                if kill_after is not None and killed is None and "requests:" in log.read_text(errors="replace"):
                    time.sleep(kill_after)
                    victims = workers_of(proc.pid)
                    if victims:
                        os.kill(victims[0], signal.SIGKILL)
                        killed = time.monotonic()
                        print(f"killed worker pid {victims[0]}", flush=True)
            if proc.poll() is None:
                print(f"{name}: still running after {timeout:.0f} s; SIGABRT for the stacks", flush=True)
                abort_all(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    end = time.monotonic()
    sampler.stop.set()
    sampler.join()
    held = [{"gpu_bus_id": bus, "pid": pid, "role": roles.get(pid, "other"), "most_mib": mib}
            for (bus, pid), mib in sorted(sampler.most.items())]
    text = log.read_text(errors="replace")
    tail = "\n".join(text.splitlines()[-40:])
    print(tail, flush=True)
    return {"rc": proc.returncode, "wall_s": end - t0, "seconds_after_kill": None if killed is None else end - killed,
            "log_tail": tail, "gpu_processes": held}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--plan", default="plans/omni_2gpu.plan")
    ap.add_argument("--kernels", help="FlashInfer modules exported by examples/tools/boot_plans.py --export-kernels")
    ap.add_argument("--requests", help="a JSONL to serve instead of making one of a2t and i2t requests")
    ap.add_argument("--a2t", type=int, default=32)
    ap.add_argument("--i2t", type=int, default=32)
    ap.add_argument("--t2s", type=int, default=8, help="requests answered with speech too (talker and Code2Wav "
                    "on another device than the thinker, in the shipped 2-GPU plan)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=240, help="seconds each run may take")
    ap.add_argument("--no-kill", action="store_true", help="skip the killed-worker run")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.kernels:
        from examples.tools.boot_plans import install_kernels
        print(f"{install_kernels(a.kernels)} FlashInfer modules installed", flush=True)
    requests = Path(a.requests) if a.requests else out / "requests" / "requests.jsonl"
    if not a.requests:
        subprocess.run([sys.executable, str(ROOT / "examples" / "bench" / "make_requests.py"), str(requests), "--t2t", "0",
                        "--a2t", str(a.a2t), "--i2t", str(a.i2t), "--t2s", str(a.t2s), "--max-tokens", str(a.max_tokens)],
                       check=True)
    result = {"plan": a.plan, "requests": len(requests.read_text().splitlines())}
    result["serve"] = graphc_run(a.plan, requests, out, "serve", a.timeout)
    stats_path = out / "serve_stats.json"
    if stats_path.is_file():
        stats = json.loads(stats_path.read_text())
        outs = [json.loads(x) for x in (out / "serve.jsonl").read_text().splitlines()]
        result["completed"] = sum(1 for o in outs if o.get("finish_reason") in ("length", "stop"))
        spoke = [o for o in outs if "audio_frames" in o]
        result["spoken"] = {"requests": len(spoke), "frames": sum(o["audio_frames"] for o in spoke),
                            "seconds": sum(o["audio_seconds"] for o in spoke),
                            "first_audio_s": sorted(o["times"].get("first_audio_s", 0) for o in spoke)}
        result["stats"] = stats
    if not a.no_kill:
        result["kill"] = graphc_run(a.plan, requests, out, "kill", a.timeout, kill_after=2.0)
    (out / "multi_gpu.json").write_text(json.dumps(result, indent=1))
    print("\n| run | exit | wall s | detail |\n|---|---|---|---|")
    st = result.get("stats", {})
    detail = "no stats"
    if st:
        r = st.get("remote", {})
        detail = (f"{result['completed']}/{result['requests']} completed, {st.get('tokens_per_s', 0):.1f} tokens/s, "
                  f"TTFT p50 {st.get('ttft_s', {}).get('p50', 0) * 1e3:.0f} ms, other-device steps {r.get('steps')}, "
                  f"{1e3 * r.get('seconds', 0) / max(r.get('steps', 0), 1):.2f} ms each, "
                  f"{1e3 * r.get('recv_seconds', 0) / max(r.get('steps', 0), 1):.3f} ms receiving")
        sp = result.get("spoken", {})
        if sp.get("requests"):
            firsts = sp["first_audio_s"]
            detail += (f"; {sp['requests']} spoke {sp['frames']} frames ({sp['seconds']:.1f} s of audio), first audio "
                       f"p50 {1e3 * firsts[len(firsts) // 2]:.0f} ms")
        for d, c in st.get("devices", {}).items():
            detail += (f"; device {d}: {c['graphs_captured']}/{c['graphs_planned']} graphs, peak "
                       f"{c['measured']} of {c['planned']} ({100 * (c['within'] or 0):+.2f}%), after run "
                       f"{c.get('after_run', {}).get('used_now')}")
    print(f"| serve | {result['serve']['rc']} | {result['serve']['wall_s']:.1f} | {detail} |")
    for g in result["serve"]["gpu_processes"]:
        print(f"|  | | | GPU {g['gpu_bus_id']}: {g['role']} (pid {g['pid']}) held at most {g['most_mib']} MiB |")
    if "kill" in result:
        k = result["kill"]
        after = k["seconds_after_kill"]
        print(f"| kill | {k['rc']} | {k['wall_s']:.1f} | ended {after if after is None else round(after, 2)} s "
              f"after the kill |")


if __name__ == "__main__":
    main()
