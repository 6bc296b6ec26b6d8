"""A plan's devices other than the engine's, each in a process of its own (issue 12).

The engine keeps the LLM node's device (the scheduler, the KV pools, sampling) in its own process. Every
other plan device gets a worker that boots only its part of the plan (boot_plan(devices=[d]): its
arenas, pools, graphs, its ledger checked) and runs the node steps the engine sends it. The
scheduler stays one, in the engine. A worker is one of two things, with the same messages:

    a process     `python -m graphc.runtime.workers ADDRESS INDEX`, started by the engine on its host;
                  control over a connection (multiprocessing.connection on loopback, with a random key)
    a Ray actor   `graphc run PLAN --ray ADDRESS` (graphc/runtime/ray_run.py): one actor per plan device
                  in a placement group; control is the actor's method calls

    messages      boot (the plan, the weights) -> booted (with its page pools); join (the process group)
                  -> ready; run (node, walk, rung, size, host inputs, layouts, which outputs the engine
                  wants, which linked inputs it sends now) -> done (the outputs' shapes) or error; send
                  (the wanted outputs, through the process group, into the receives the engine posts once
                  it has told the worker) -> sent; stop
    data          torch.distributed point to point, ranks = plan devices, rendezvous at rank 0: NCCL
                  between GPUs (device to device, never through the host), gloo between CPU processes.
                  A step's host inputs (mel features, pixel patches, positions) go with the step. The
                  inputs of a node the engine drives (declare.Link: a second autoregressive stage's rows
                  made from the LLM's embeddings and hidden states) are sent right after the step, into the
                  worker's static receive buffers; an input on the engine's device that no link names is
                  refused. The outputs the engine wants come back into its device's static receive
                  buffers. Every buffer is one per (source, port) at the largest step of the walks that
                  size it (IR.transfers_into): the plan's transfers.NODE ledger lines, allocated and
                  measured at boot.

A worker that dies is seen at the next step that waits on it (its process or actor is watched while
the engine waits) or before the next step: WorkerDied names the device; the engine fails what is in
flight and stops.
"""
from __future__ import annotations

import math
import os
import pickle
import secrets
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections import deque
from datetime import timedelta
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge

import torch
import torch.distributed as dist

from graphc.errors import InvalidInput, WorkerDied
from graphc.plan import Plan
from graphc.runtime.check import compare, verdict
from graphc.runtime.progress import BootProgress
from graphc.step import TORCH_DTYPES
from resources.paged_kv import PageAllocator

POLL_S = 0.05                  # how often a waiting engine looks at its workers
BOOT_TIMEOUT_S = 3600.0        # the longest a worker may take to boot (captures on a GPU take minutes)
STEP_TIMEOUT_S = 600.0         # the longest a worker may take to join the process group or to run a step


def _send(conn: Connection, msg) -> None:
    """Plain pickle (torch's multiprocessing pickler would share CPU tensors by file descriptor)."""
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection):
    return pickle.loads(conn.recv_bytes())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def visible_gpu(index: int) -> str:
    """The CUDA_VISIBLE_DEVICES entry of plan device `index` (the index-th GPU this process sees)."""
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x for x in seen.split(",") if x.strip()] if seen else None
    if ids is not None and index >= len(ids):
        raise WorkerDied(f"plan device {index} has no GPU", f"CUDA_VISIBLE_DEVICES={seen} shows {len(ids)}",
                         "make one GPU visible per plan device")
    return ids[index] if ids is not None else str(index)


def device_memory(device: torch.device) -> dict:
    """What a GPU holds now, device-wide (NCCL's buffers and every context on it included), and the most
    torch's allocator reserved since boot; nothing on a CPU."""
    if device.type != "cuda":
        return {}
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return {"used_now": total - free, "peak_reserved": torch.cuda.max_memory_reserved(device)}


def comm_measured(boot, before: dict, joined: dict) -> None:
    """What joining the process group and the first exchanges added to a GPU, device-wide (NCCL's
    communicator, then its buffers for each pair): the boot's `comm` line, added to its measured peak;
    the part the join alone added is kept apart (_comm_join)."""
    if not before:
        return
    grew = device_memory(boot.device)["used_now"] - before["used_now"]
    boot.measured["comm"] = grew
    boot.measured["_comm_join"] = joined["used_now"] - before["used_now"]
    boot.measured["_peak_device"] = boot.measured.get("_peak_device", before["used_now"]) + grew


def join_group(init: str, world: int, rank: int, device: torch.device) -> None:
    """This process's rank in the plan's process group: gloo on CPU; on a GPU, NCCL with the process's own
    device made current and the communicator created now (device_id), not inside the first send and
    receive (where it blocks until both sides are there)."""
    eager = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        eager = {"device_id": device}
        # one stream of exchanges, one at a time: that NCCL serializes them with each other is what we want
        os.environ.setdefault("TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING", "false")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init, world_size=world,
                            rank=rank, timeout=timedelta(seconds=STEP_TIMEOUT_S), **eager)


class DeviceWorker:
    """One plan device's worker: what a worker process or a Ray actor runs, message by message."""

    def __init__(self, index: int):
        self.index = index
        self.runner = None
        self.pending: list[torch.Tensor] = []       # a step's wanted outputs, until the engine asks for them
        self.engine_rank = None

    def handle(self, msg):
        """Answer one message: ('booted' | 'ready' | 'done' | 'sent' | 'address', ...), ('failed',
        traceback) when a boot, a join or a send fails, ('error', why) when a step fails (the worker goes
        on); None for stop."""
        kind = msg[0]
        if kind == "boot":
            try:
                return "booted", self._boot(*msg[1:])
            except BaseException:
                return "failed", traceback.format_exc()
        if kind == "address":                        # the rendezvous, where this worker is rank 0
            host = msg[1]
            return "address", f"tcp://{host}:{free_port(host)}"
        if kind == "join":
            return self._join(*msg[1:])
        if kind == "run":
            return self._run(*msg[1:])
        if kind == "send":
            return self._send_pending()
        if kind == "memory":
            return "memory", device_memory(self.runner.boot.device)
        if kind == "stop":
            if dist.is_initialized():
                dist.destroy_process_group()
            return None
        return "failed", f"unknown message {kind!r}"

    def _join(self, init: str, world: int, engine_rank: int):
        """This device's rank in the plan's process group, its link to the engine made, its boot checked."""
        self.engine_rank = engine_rank
        boot = self.runner.boot
        try:
            before = device_memory(boot.device)
            join_group(init, world, self.index, boot.device)
            joined = device_memory(boot.device)
            # the link to the engine, made now: NCCL connects a pair and allocates its buffers at their
            # first exchange, which would otherwise fall in a step and outside the boot's measurement
            dist.send(torch.zeros(1, device=boot.device), dst=self.engine_rank)
            comm_measured(boot, before, joined)
        except BaseException:
            return "failed", traceback.format_exc()
        return "ready", verdict(compare(boot))

    def _run(self, node: str, walk: str, rung: int | None, size: int, inputs: dict, layouts: dict, want: list,
             linked: list):
        """One node step: its linked inputs received first, its wanted outputs kept until the engine asks."""
        try:                         # the engine sends these right after the step: a failed receive ends us
            for port, shape, key in linked:
                buf = self.runner.boot.transfers[key]
                view = buf[:math.prod(shape)].view(shape)
                dist.recv(view, src=self.engine_rank)
                inputs[port] = view
        except BaseException:
            return "failed", traceback.format_exc()
        try:
            out = self.runner.run_node(node, walk, rung, size, inputs, layouts)
            ready = {p: (tuple(out[p].shape), out[p].dtype) for p in want}
        except BaseException as e:             # the step fails; the worker goes on
            self.pending = []
            return "error", f"{type(e).__name__}: {e}"
        self.pending = [out[p].contiguous() for p in want]
        return "done", ready

    def _send_pending(self):
        """The last step's wanted outputs, into the receives the engine posted; a send that fails ends the
        worker."""
        try:
            for t in self.pending:
                dist.send(t, dst=self.engine_rank)
        except BaseException:
            return "failed", traceback.format_exc()
        finally:
            self.pending = []
        return "sent", None

    def _boot(self, plan_json: str, options: dict) -> dict:
        if options.get("gpu") is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = options["gpu"]
        from graphc.runtime.boot import boot_plan
        from graphc.runtime.executor import NodeRunner, scratch_pages

        plan = Plan.model_validate_json(plan_json)
        boot = boot_plan(plan, devices=[self.index], checkpoint=options.get("checkpoint"),
                         seed=options.get("seed", 0), emulate=options.get("emulate", False),
                         force=options.get("force", False), prebuild=options.get("prebuild", True))[0]
        scratch = scratch_pages(boot)
        self.runner = NodeRunner(boot, scratch)
        # its page pools and scratch pages: the engine keeps their bookkeeping (page tables go with each step)
        return {"graphs": len(boot.graphs), "faults": list(boot.faults), "pid": os.getpid(),
                "pools": {res: alloc.num_pages for res, alloc in boot.pages.items()}, "scratch": scratch}


def worker_main(address: str, index: int) -> None:
    """A worker process: connect to the engine, then answer its messages until told to stop (or it is gone)."""
    answer_messages(connect(address, index), DeviceWorker(index).handle)


def answer_messages(conn: Connection, handle) -> None:
    """Answer the engine's messages with handle(msg) (a reply, or None for none) until stop, a 'failed' reply or
    the engine gone; a handler that raises replies 'failed' with its traceback. Then leave the process group."""
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, OSError):                        # the engine is gone: so is this process
            break
        try:
            reply = handle(msg)
        except BaseException:
            reply = ("failed", traceback.format_exc())
        if reply is not None:
            _send(conn, reply)
        if msg[0] == "stop" or (reply is not None and reply[0] == "failed"):
            break
    if dist.is_initialized():
        dist.destroy_process_group()


# ---- the engine's side: one link per worker --------------------------------------------------------

class ProcessLink:
    """A worker process on this host, started by the engine."""

    kinds = "worker processes"

    def __init__(self, proc: subprocess.Popen, conn: Connection):
        self.proc, self.conn = proc, conn

    def request(self, msg) -> None:
        _send(self.conn, msg)

    def wait(self, timeout: float) -> bool:
        return self.conn.poll(timeout)

    def answer(self):
        try:
            return _recv(self.conn)
        except (EOFError, OSError):
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                return "gone", "it closed its connection and is still running"
            return "gone", self.gone()

    def gone(self) -> str | None:
        code = self.proc.poll()
        if code is None:
            return None
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                _send(self.conn, ("stop",))
            except (BrokenPipeError, OSError):
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def start_processes(indices: list[int], entry: str, env: dict[int, dict] | None = None) -> dict[int, ProcessLink]:
    """`python -m ENTRY ADDRESS INDEX` for each index, each connected back to this process (loopback, a random
    key); env: extra environment of an index's process. A process that dies before it connects is WorkerDied."""
    key = secrets.token_bytes(32)
    procs, links = {}, {}
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(POLL_S)
        addr = "%s:%d" % server.getsockname()[:2]
        for d in indices:
            extra = {"GRAPHC_WORKER_KEY": key.hex(), **(env or {}).get(d, {})}
            procs[d] = subprocess.Popen([sys.executable, "-m", entry, addr, str(d)], env={**os.environ, **extra})
        try:
            while len(links) < len(procs):
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    for d, p in procs.items():      # a worker that died before it connected
                        if p.poll() is not None:
                            raise WorkerDied(f"the worker of device {d} died (exit code {p.returncode})",
                                             "it was starting", "see its output above; the engine stops")
                    continue
                sock.setblocking(True)
                conn = Connection(sock.detach())
                deliver_challenge(conn, key)         # what Listener(authkey=...) does on accept
                answer_challenge(conn, key)
                _, d = _recv(conn)
                links[d] = ProcessLink(procs[d], conn)
        except BaseException:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
            raise
    return links


def await_answer(link, who: str, doing: str, waiting: str, timeout: float, t0: float) -> None:
    """Until link has a message, its process watched: WorkerDied naming `who` when it dies, or when it has not
    answered `timeout` seconds after t0 (time.monotonic())."""
    while not link.wait(POLL_S):
        gone = link.gone()
        if gone is not None:
            raise WorkerDied(f"{who} died ({gone})", doing, "see its output above; the engine stops")
        if time.monotonic() - t0 > timeout:
            raise WorkerDied(f"{who} did not answer in {timeout:.0f} s", waiting, "the engine stops")


def connect(address: str, index: int) -> Connection:
    """A started process's connection to the engine (start_processes), its hello sent."""
    host, port = address.rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ.pop("GRAPHC_WORKER_KEY")))
    _send(conn, ("hello", index))
    return conn


class Workers:
    """The workers of a plan's devices other than `local` (the engine's)."""

    def __init__(self, plan: Plan, local: int, device: torch.device, boot_local, *, checkpoint: str | None = None,
                 seed: int = 0, emulate: bool = False, force: bool = False, prebuild: bool = True,
                 links: dict | None = None, host: str = "127.0.0.1", progress: BootProgress | None = None):
        """boot_local(): boots the engine's own device (its DeviceBoot) while the workers boot theirs.
        links: the workers' links when something else started them (Ray actors: ray_run.py), else one
        process each is started here. host: this process's address as the other ranks reach it. progress:
        where the `workers` phase (the wait, after this process's own boot, for each worker's) is reported; the
        workers themselves report nothing (graphc/runtime/progress.py)."""
        if dist.is_initialized():
            raise InvalidInput("this process already drives a multi-device plan",
                               "its devices share torch.distributed's one process group",
                               "close() the other engine first, or serve this plan from another process")
        self.local, self.device = local, device
        self.of = {n: d.index for d in plan.devices for n in d.nodes}        # node -> plan device
        world = len(plan.devices)
        self.links = links if links is not None else {}
        try:
            if links is None:
                self._start_processes(world, local)
            opts = {"checkpoint": checkpoint, "seed": seed, "emulate": emulate, "force": force, "prebuild": prebuild}
            self._boot_all(plan, boot_local, opts, progress or BootProgress())
            self._join_all(world, host)
        except BaseException:
            self.close()
            raise
        # the engine's device's receive buffers, one per (source, port): the plan's transfers.NODE ledger
        # lines (IR.transfers_into), allocated and measured with the rest of its device's boot
        self.buffers = self.booted.transfers
        self.linked = self._linked_inputs()
        self._mirror_pools()
        # remote node steps; bytes sent and received through the process group; seconds the engine spent in
        # those steps (waiting on the worker included), in sending the step (its host inputs pickled, its
        # linked inputs sent), and in receiving their outputs after the worker was done
        self.stats = {"steps": 0, "send_bytes": 0, "recv_bytes": 0, "seconds": 0.0, "request_seconds": 0.0,
                      "recv_seconds": 0.0}
        self.recent = deque(maxlen=4096)       # (seconds, recv seconds) of the latest node steps

    def _boot_all(self, plan: Plan, boot_local, opts: dict, progress: BootProgress) -> None:
        """Every worker boots its device while this process boots its own; a worker's faults end the boot."""
        for d, link in self.links.items():
            gpu = visible_gpu(d) if self.device.type == "cuda" and isinstance(link, ProcessLink) else None
            link.request(("boot", plan.model_dump_json(), opts | {"gpu": gpu}))
        self.booted = boot_local()
        self.summaries = {}
        with progress.phase("workers", len(self.links), "device", "booted") as phase:
            for d in self.links:
                self.summaries[d] = self._wait(d, "booted", BOOT_TIMEOUT_S)
                phase.update(1)
        for d, s in self.summaries.items():
            if s["faults"]:
                raise WorkerDied(f"device {d} booted with faults", "; ".join(s["faults"][:3]),
                                 "see graphc check on that device")

    def _join_all(self, world: int, host: str) -> None:
        """The plan's process group, every worker's link to this process made and its boot checked; what
        joining added to this device measured (its `comm` line)."""
        local, device = self.local, self.device
        if local == 0:                                  # the rendezvous is at rank 0
            init = f"tcp://{host}:{free_port(host)}"
        else:
            self.links[0].request(("address", host if isinstance(self.links[0], ProcessLink) else None))
            init = self._wait(0, "address", STEP_TIMEOUT_S)
        for d, link in self.links.items():
            link.request(("join", init, world, local))
        before = device_memory(device)
        join_group(init, world, local, device)
        joined = device_memory(device)
        self.checks = {}
        for d in sorted(self.links):             # each worker's first send (its link made), then its check
            dist.recv(torch.empty(1, device=device), src=d)
            self.checks[d] = self._wait(d, "ready", STEP_TIMEOUT_S)
        comm_measured(self.booted, before, joined)

    def _linked_inputs(self) -> dict[str, dict[str, tuple]]:
        """What the engine sends a driven node's worker (declare.Link): node -> port -> (the worker's buffer
        key, its elements, dtype)."""
        ir, model = self.booted.ir, self.booted.ir.model
        linked: dict[str, dict[str, tuple]] = {}
        for d in self.links:
            room = {(src, label): (n, dt) for src, label, n, dt in ir.transfers_into(
                [x for x, dev in self.of.items() if dev == d])}
            for ln in model.links:
                if self.of.get(ln.dst) == d and self.of.get(ln.src) == self.local:
                    linked[ln.dst] = {p: (ln.input_key(p), *room[ln.input_key(p)]) for p in ln.inputs}
        return linked

    def _mirror_pools(self) -> None:
        """The workers' page pools, kept here (a step sends its page tables): the same pages free, their
        scratch pages taken as the worker took them."""
        self.pools: dict[str, PageAllocator] = {}
        self.reserved: dict[str, int] = {}
        for d, s in self.summaries.items():
            for res, n in s["pools"].items():
                self.pools[res] = PageAllocator(n)
                if res in s["scratch"]:
                    taken = self.pools[res].allocate(1)
                    if taken != [s["scratch"][res]]:
                        raise WorkerDied(f"device {d}'s {res} pool took scratch page {s['scratch'][res]}",
                                         f"the engine's copy of its pages would take {taken}", "a bookkeeping bug")
                    self.reserved[res] = 1

    def _start_processes(self, world: int, local: int) -> None:
        self.links.update(start_processes([d for d in range(world) if d != local], "graphc.runtime.workers"))

    @property
    def kind(self) -> str:
        return next(iter(self.links.values())).kinds if self.links else "workers"

    # ---- waiting, with the workers watched
    def _wait(self, d: int, expect: str, timeout: float):
        link, t0 = self.links[d], time.monotonic()
        doing = {"booted": "booting", "ready": "joining", "address": "joining", "sent": "sending a step's outputs",
                 "memory": "reporting its memory"}.get(expect, "running a step")
        await_answer(link, f"the worker of device {d}", f"it was {doing}", f"waiting for {expect}", timeout, t0)
        msg = link.answer()
        if msg[0] == "gone":
            raise WorkerDied(f"the worker of device {d} died ({msg[1]})", f"it was {doing}", "the engine stops")
        if msg[0] == "failed":
            raise WorkerDied(f"the worker of device {d} failed while {doing}", msg[1].strip().splitlines()[-1],
                             "its traceback:\n" + msg[1])
        if msg[0] == "error":
            raise RuntimeError(f"device {d}: {msg[1]}")
        if msg[0] != expect:
            raise WorkerDied(f"the worker of device {d} answered {msg[0]!r}, not {expect!r}", "", "")
        return msg[1]

    def check(self) -> None:
        """Raise WorkerDied if a worker has ended."""
        for d, link in self.links.items():
            gone = link.gone()
            if gone is not None:
                raise WorkerDied(f"the worker of device {d} died ({gone})", "", "the engine stops")

    def memory(self) -> dict[int, dict]:
        """Each worker's device_memory (from the engine's thread, between steps)."""
        out = {}
        for d, link in self.links.items():
            link.request(("memory",))
            out[d] = self._wait(d, "memory", STEP_TIMEOUT_S)
        return out

    # ---- one node of a step on its device
    def run(self, node: str, walk: str, rung: int | None, size: int, inputs: dict, layouts: dict,
            want: list[str]) -> dict[str, torch.Tensor]:
        d = self.of[node]
        t0 = time.perf_counter()
        works, sends = self._request_step(node, walk, rung, size, inputs, layouts, want)
        self.stats["request_seconds"] += time.perf_counter() - t0
        ready = self._wait(d, "done", STEP_TIMEOUT_S)
        for w, t in zip(works, sends):               # the worker received them before it ran the step
            w.wait()
            self.stats["send_bytes"] += t.numel() * t.element_size()
        t1 = time.perf_counter()
        out = self._receive_outputs(node, ready, want)
        t2 = time.perf_counter()
        self.stats["recv_seconds"] += t2 - t1
        self.stats["seconds"] += t2 - t0
        self.stats["steps"] += 1
        self.recent.append((t2 - t0, t2 - t1))
        return out

    def _request_step(self, node: str, walk: str, rung: int | None, size: int, inputs: dict, layouts: dict,
                      want: list[str]) -> tuple[list, list[torch.Tensor]]:
        """The step sent to its worker: host inputs with the message, linked inputs device to device right
        after it (the sends' works, and what they send)."""
        d = self.of[node]
        linked = self.linked.get(node, {})
        on_device = [k for k, v in inputs.items() if v.device.type != "cpu" and k not in linked]
        if on_device:
            raise RuntimeError(f"{node}'s inputs {on_device} are on the engine's device and no link declares "
                               "them; a step sends a worker host inputs, and linked inputs device to device")
        host, sends, meta = {}, [], []
        for k, v in inputs.items():
            if k not in linked:
                host[k] = v
                continue
            key, room, dtype = linked[k]
            t = v.to(device=self.device, dtype=TORCH_DTYPES[dtype]).contiguous()
            if t.numel() > room:
                raise RuntimeError(f"{node}.{k} is {tuple(t.shape)}; its receive buffer on device {d} holds {room:,} "
                                   f"elements (the plan sizes it at {node}'s largest step)")
            sends.append(t)
            meta.append((k, tuple(t.shape), key))
        self.links[d].request(("run", node, walk, rung, size, host, layouts, list(want), meta))
        # sent without waiting: a dead worker is seen below, not in a send that no receive meets
        return [dist.isend(t, dst=d) for t in sends], sends

    def _receive_outputs(self, node: str, ready: dict, want: list[str]) -> dict[str, torch.Tensor]:
        """The step's wanted outputs, into this device's receive buffers (views of them)."""
        d = self.of[node]
        out = {}
        views = []
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
            out[p] = buf[:n].view(shape)
            views.append(out[p])
        if views:
            # the worker is told first: NCCL creates the pair's communicator lazily, in the first send and
            # receive, and blocks until both sides are in it (receives posted first waited for a worker that
            # was waiting for this message: the first GPU run hung there). Its answer says its sends went,
            # or that one failed (WorkerDied), so no receive is left waiting on a send that never comes.
            self.links[d].request(("send",))
            works = [dist.irecv(v, src=d) for v in views]
            self._wait(d, "sent", STEP_TIMEOUT_S)
            for w, v in zip(works, views):
                w.wait()
                self.stats["recv_bytes"] += v.numel() * v.element_size()
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()      # the received rows are there
        return out

    def step_stats(self) -> dict:
        """The totals, and the median and largest step and receive times of the latest node steps (ms)."""
        out = dict(self.stats)
        if self.recent:
            for i, name in ((0, "step_ms"), (1, "recv_ms")):
                xs = sorted(r[i] for r in self.recent)
                out[name] = {"p50": 1e3 * xs[len(xs) // 2], "max": 1e3 * xs[-1]}
        return out

    def close(self) -> None:
        # this process leaves the group first: the rendezvous store lives in rank 0's process, a worker's
        # when the engine is not device 0, and NCCL's watchdog here complains when it goes first
        if dist.is_initialized():
            dist.destroy_process_group()
        for link in self.links.values():
            link.close()


if __name__ == "__main__":
    worker_main(sys.argv[1], int(sys.argv[2]))
