"""A plan of several devices: one worker process for each device but the engine's own.

The engine's process boots the device that holds the LLM (it samples there) and drives the rest: each
other plan device gets a worker process (`python -m graphc.runtime.workers`, so nothing of the caller's
script runs again in it) that boots only that device's part of the plan (its
arenas, pools and graphs; its ledger checked as at any boot) and runs its nodes when told. The
scheduler stays one, in the engine.

    control   a connection per worker (multiprocessing.connection on loopback, with a random key): the step (node, walk, rung, size, host inputs, layouts, which outputs
              the engine wants), then the worker's answer (done, or the step's error)
    data      torch.distributed point to point, ranks = plan devices: NCCL between GPUs (device to
              device, never through the host), gloo between CPU processes. A step's inputs are host
              tensors (mel features, pixel patches) and go with the step; inputs on the engine's device
              are refused (nothing sends one yet: speech across devices is not served). The outputs
              the engine wants come back into its device's static receive buffers, one per edge source
              (node, port) at the largest step of the node's walks (IR.transfers_into): the plan's transfers.NODE
              ledger lines, allocated and measured at boot.

A worker that dies is seen at the next step that waits on it (its process is polled while the engine
waits): WorkerDied names the device and its exit code; the engine fails what is in flight and stops.
"""
from __future__ import annotations

import os
import pickle
import secrets
import socket
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge

import torch
import torch.distributed as dist

from graphc.errors import GraphcError, InvalidInput
from graphc.plan import Plan

POLL_S = 0.05                  # how often a waiting engine looks at its workers' processes
BOOT_TIMEOUT_S = 3600.0        # the longest a worker may take to boot (captures on a GPU take minutes)
STEP_TIMEOUT_S = 600.0         # the longest a worker may take to join the process group or to run a step


class WorkerDied(GraphcError):
    """A plan device's worker process ended or failed to boot; the engine cannot go on."""

    exit_code = 3


def _send(conn: Connection, msg) -> None:
    """Plain pickle (torch's multiprocessing pickler would share CPU tensors by file descriptor)."""
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection):
    return pickle.loads(conn.recv_bytes())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def visible_gpu(index: int) -> str:
    """The CUDA_VISIBLE_DEVICES entry of plan device `index` (the index-th GPU this process sees)."""
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x for x in seen.split(",") if x.strip()] if seen else None
    if ids is not None and index >= len(ids):
        raise WorkerDied(f"plan device {index} has no GPU", f"CUDA_VISIBLE_DEVICES={seen} shows {len(ids)}",
                         "make one GPU visible per plan device")
    return ids[index] if ids is not None else str(index)


def worker_main(address: str, index: int) -> None:
    """A worker process: connect to the engine, boot plan device `index`, join the process group, run
    steps until told to stop."""
    host, port = address.rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ.pop("GRAPHC_WORKER_KEY")))
    _send(conn, ("hello", index))
    plan_json, rank_of_engine, init, world, options = _recv(conn)
    try:
        if options.get("gpu") is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = options["gpu"]
        from graphc.runtime.boot import boot_plan
        from graphc.runtime.executor import NodeRunner, scratch_pages

        plan = Plan.model_validate_json(plan_json)
        boot = boot_plan(plan, devices=[index], checkpoint=options.get("checkpoint"), seed=options.get("seed", 0),
                         emulate=options.get("emulate", False), force=options.get("force", False),
                         prebuild=options.get("prebuild", True))[0]
        runner = NodeRunner(boot, scratch_pages(boot))
        _send(conn, ("booted", {"graphs": len(boot.graphs), "faults": list(boot.faults)}))
        backend = "nccl" if boot.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init, world_size=world, rank=index,
                                timeout=timedelta(seconds=STEP_TIMEOUT_S))
        _send(conn, ("ready", None))
    except BaseException:
        _send(conn, ("failed", traceback.format_exc()))
        return
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, OSError):                        # the engine is gone: so is this worker
            break
        if msg[0] == "stop":
            break
        _, node, walk, rung, size, inputs, layouts, want = msg
        try:
            out = runner.run_node(node, walk, rung, size, inputs, layouts)
            ready = {p: (tuple(out[p].shape), out[p].dtype) for p in want}
        except BaseException as e:                         # the step fails; the worker goes on
            _send(conn, ("error", f"{type(e).__name__}: {e}"))
            continue
        _send(conn, ("done", ready))
        for p in want:
            dist.send(out[p].contiguous(), dst=rank_of_engine)
    dist.destroy_process_group()


class Workers:
    """The worker processes of a plan's devices other than `local` (the engine's)."""

    def __init__(self, plan: Plan, local: int, device: torch.device, boot_local, *, checkpoint: str | None = None,
                 seed: int = 0, emulate: bool = False, force: bool = False, prebuild: bool = True):
        """boot_local(): boots the engine's own device (its DeviceBoot) while the workers boot theirs."""
        if dist.is_initialized():
            raise InvalidInput("this process already drives a multi-device plan",
                               "its devices share torch.distributed's one process group",
                               "close() the other engine first, or serve this plan from another process")
        self.local, self.device = local, device
        self.of = {n: d.index for d in plan.devices for n in d.nodes}        # node -> plan device
        world = len(plan.devices)
        init = f"tcp://127.0.0.1:{_free_port()}"
        key = secrets.token_bytes(32)
        self.procs, self.conns = {}, {}
        with socket.create_server(("127.0.0.1", 0)) as server:
            server.settimeout(POLL_S)
            addr = "%s:%d" % server.getsockname()[:2]
            for d in range(world):
                if d != local:
                    env = {**os.environ, "GRAPHC_WORKER_KEY": key.hex()}
                    self.procs[d] = subprocess.Popen([sys.executable, "-m", "graphc.runtime.workers", addr, str(d)],
                                                     env=env)
            try:
                while len(self.conns) < len(self.procs):
                    try:
                        sock, _ = server.accept()
                    except TimeoutError:
                        self.check()                   # a worker that died before it connected
                        continue
                    sock.setblocking(True)
                    conn = Connection(sock.detach())
                    deliver_challenge(conn, key)         # what Listener(authkey=...) does on accept
                    answer_challenge(conn, key)
                    _, d = _recv(conn)
                    opts = {"checkpoint": checkpoint, "seed": seed, "emulate": emulate, "force": force,
                            "prebuild": prebuild, "gpu": visible_gpu(d) if device.type == "cuda" else None}
                    _send(conn, (plan.model_dump_json(), local, init, world, opts))
                    self.conns[d] = conn
            except BaseException:
                self.close()
                raise
        self.booted = boot_local()
        try:
            self.summaries = {d: self._wait(d, "booted", BOOT_TIMEOUT_S) for d in self.procs}
            for d, s in self.summaries.items():
                if s["faults"]:
                    raise WorkerDied(f"device {d} booted with faults", "; ".join(s["faults"][:3]),
                                     "see graphc check on that device")
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, init_method=init, world_size=world, rank=local,
                                    timeout=timedelta(seconds=STEP_TIMEOUT_S))
            for d in self.procs:
                self._wait(d, "ready", STEP_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        # the engine's device's receive buffers, one per edge source port: the plan's transfers.NODE ledger
        # lines (IR.transfers_into), allocated and measured with the rest of its device's boot
        self.buffers = self.booted.transfers
        # remote node steps; bytes received through the process group; seconds the engine spent in those
        # steps (waiting on the worker included) and in receiving their outputs after the worker was done
        self.stats = {"steps": 0, "recv_bytes": 0, "seconds": 0.0, "recv_seconds": 0.0}

    # ---- waiting, with the workers' processes watched
    def _wait(self, d: int, expect: str, timeout: float):
        conn, proc, t0 = self.conns[d], self.procs[d], time.monotonic()
        while not conn.poll(POLL_S):
            if proc.poll() is not None:
                raise WorkerDied(f"the worker of device {d} died (exit code {proc.returncode})",
                                 f"it was {'booting' if expect in ('booted', 'ready') else 'running a step'}",
                                 "see its output above; the engine stops")
            if time.monotonic() - t0 > timeout:
                raise WorkerDied(f"the worker of device {d} did not answer in {timeout:.0f} s", f"waiting for {expect}",
                                 "the engine stops")
        try:
            msg = _recv(conn)
        except (EOFError, OSError):
            raise WorkerDied(f"the worker of device {d} closed its connection (exit code {proc.poll()})", "",
                             "the engine stops") from None
        if msg[0] == "failed":
            raise WorkerDied(f"the worker of device {d} failed to boot", msg[1].strip().splitlines()[-1],
                             "its traceback:\n" + msg[1])
        if msg[0] == "error":
            raise RuntimeError(f"device {d}: {msg[1]}")
        if msg[0] != expect:
            raise WorkerDied(f"the worker of device {d} answered {msg[0]!r}, not {expect!r}", "", "")
        return msg[1]

    def check(self) -> None:
        """Raise WorkerDied if a worker's process has ended."""
        for d, p in self.procs.items():
            if p.poll() is not None:
                raise WorkerDied(f"the worker of device {d} died (exit code {p.returncode})", "", "the engine stops")

    # ---- one node of a step on its device
    def run(self, node: str, walk: str, rung: int | None, size: int, inputs: dict, layouts: dict,
            want: list[str]) -> dict[str, torch.Tensor]:
        d = self.of[node]
        t0 = time.perf_counter()
        on_device = [k for k, v in inputs.items() if v.device.type != "cpu"]
        if on_device:
            raise RuntimeError(f"{node}'s inputs {on_device} are on the engine's device; a step sends a worker "
                               "host inputs only")
        _send(self.conns[d], ("run", node, walk, rung, size, inputs, layouts, list(want)))
        ready = self._wait(d, "done", STEP_TIMEOUT_S)
        t1 = time.perf_counter()
        out = {}
        for p in want:
            shape, dtype = ready[p]
            buf = self.buffers.get((node, p))
            if buf is None:
                raise RuntimeError(f"{node}.{p} has no receive buffer on device {self.local}: only the plan's "
                                   "edges into this device's nodes cross devices")
            n = torch.Size(shape).numel()
            if buf.dtype != dtype or n > buf.numel():
                raise RuntimeError(f"{node}.{p} came back {shape} {dtype}; its receive buffer holds {buf.numel()} "
                                   f"{buf.dtype}")
            view = buf[:n].view(shape)
            dist.recv(view, src=d)
            out[p] = view
            self.stats["recv_bytes"] += n * view.element_size()
        if want and self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()      # the received rows are there
        t2 = time.perf_counter()
        self.stats["recv_seconds"] += t2 - t1
        self.stats["seconds"] += t2 - t0
        self.stats["steps"] += 1
        return out

    def close(self) -> None:
        for d, conn in self.conns.items():
            if self.procs[d].poll() is None:
                try:
                    _send(conn, ("stop",))
                except (BrokenPipeError, OSError):
                    pass
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    worker_main(sys.argv[1], int(sys.argv[2]))
