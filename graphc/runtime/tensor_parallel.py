"""A plan of N tensor-parallel ranks (plan.tensor_parallel): one copy of the model, every node's heads and MLP
divided over N devices, one rank each, all holding the plan's one device's ledger.

The engine's process is rank 0: it schedules, samples and drives. Every other rank is a process of its own,
`python -m graphc.runtime.tensor_parallel ADDRESS RANK`, that boots the same plan with its rank's part of the
weights and runs each node step the engine runs, at the same time, on the same inputs; a node's partial
outputs are summed over the ranks inside its forward (StepContext.reduce: an all-reduce, gloo between CPU
processes, NCCL between GPUs). Nothing else crosses: page tables and slots are the engine's, and every rank's
pools are the same size, so the same page ids name each rank's part of the same rows.

    messages  join (the process group's address) -> ready; boot (the plan, options) -> booted (its graphs, faults,
              ledger check and scratch pages, which must be the engine's); run (node, walk, rung, size, inputs,
              layouts): no answer; stop
    inputs    host tensors go with the message. A tensor on the engine's GPU (the step's token ids, resolved on
              the device from the step in flight) is broadcast from rank 0 right after it. An output of a node
              the step ran before (an encoder's rows the LLM splices) is named: each rank uses its own.

A rank whose step fails, or that dies, ends; the engine sees it before its next node step and stops
(WorkerDied names the rank). One left inside a reduction the other side never joins is seen when gloo reports
the closed connection; on NCCL, when the process group's timeout (workers.STEP_TIMEOUT_S) ends it.
"""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from graphc.errors import InvalidInput
from graphc.plan import Plan
from graphc.runtime.check import compare, verdict
from graphc.runtime.progress import BootProgress
from graphc.runtime.workers import (BOOT_TIMEOUT_S, POLL_S, STEP_TIMEOUT_S, WorkerDied, answer_messages, await_answer,
                                    connect, free_port, join_group, start_processes, visible_gpu)
from graphc.step import TORCH_DTYPES

ENTRY = "graphc.runtime.tensor_parallel"
DTYPES = {v: k for k, v in TORCH_DTYPES.items()}


class Ranks:
    """The engine's side: ranks 1..N-1 of a tensor-parallel plan, booted with this process's rank 0."""

    def __init__(self, plan: Plan, boot_local, opts: dict, host: str = "127.0.0.1",
                 progress: BootProgress | None = None, gpu: int = 0):
        """boot_local(): boots rank 0 here (its DeviceBoot) while the other ranks boot theirs; their steps meet
        in the reductions. opts: the boot's options (checkpoint, seed, emulate, force, prebuild)."""
        if dist.is_initialized():
            raise InvalidInput("this process already drives a plan of several devices or ranks",
                               "they share torch.distributed's one process group",
                               "close() the other engine first, or serve this plan from another process")
        self.world = plan.tensor_parallel
        cuda = plan.target.arch != "cpu"
        self.device = torch.device("cuda", gpu) if cuda else torch.device("cpu")
        env = {r: {"CUDA_VISIBLE_DEVICES": visible_gpu(gpu + r)} for r in range(1, self.world)} if cuda else None
        self.links = start_processes(list(range(1, self.world)), ENTRY, env)
        self.held: dict[str, dict] = {}          # node -> its outputs of the latest step, kept alive while named
        self.names: dict[int, tuple[str, str]] = {}
        self.scratch: dict[int, dict] = {}
        try:
            self._join(host)
            for link in self.links.values():
                link.request(("boot", plan.model_dump_json(), opts))
            self.booted = boot_local()
            with (progress or BootProgress()).phase("ranks", len(self.links), "rank", "booted") as phase:
                self.checks = {}
                for r in self.links:
                    self.checks[r] = self._booted(r, self._wait(r, "booted", BOOT_TIMEOUT_S))
                    phase.update(1)
        except BaseException:
            self.close()
            raise

    def _join(self, host: str) -> None:
        init = f"tcp://{host}:{free_port(host)}"
        for link in self.links.values():
            link.request(("join", init, self.world))
        join_group(init, self.world, 0, self.device)
        for r in self.links:
            self._wait(r, "ready", STEP_TIMEOUT_S)

    def _booted(self, r: int, summary: dict) -> dict:
        """A rank's boot summary checked (no faults); its ledger check."""
        if summary["faults"]:
            raise WorkerDied(f"tensor-parallel rank {r} booted with faults", "; ".join(summary["faults"][:3]),
                             "see graphc check")
        self.scratch[r] = summary["scratch"]
        return summary["check"]

    def agree(self, scratch: dict) -> None:
        """Every rank took the engine's scratch pages and slots: padding rows of a captured rung write them, and
        the engine's page tables, which every rank reads, never hand them out."""
        for r, theirs in self.scratch.items():
            if theirs != scratch:
                raise WorkerDied(f"tensor-parallel rank {r} took scratch pages {theirs}", f"the engine took {scratch}",
                                 "a bookkeeping bug")

    def _wait(self, r: int, expect: str, timeout: float):
        await_answer(self.links[r], f"tensor-parallel rank {r}", f"waiting for {expect}", f"waiting for {expect}",
                     timeout, time.monotonic())
        return self._answer(r, expect)

    def _answer(self, r: int, expect: str | None):
        msg = self.links[r].answer()
        if msg[0] == "gone":
            raise WorkerDied(f"tensor-parallel rank {r} died ({msg[1]})", "", "the engine stops")
        if msg[0] == "failed":
            raise WorkerDied(f"tensor-parallel rank {r} failed", msg[1].strip().splitlines()[-1],
                             "its traceback:\n" + msg[1])
        if msg[0] != expect:
            raise WorkerDied(f"tensor-parallel rank {r} answered {msg[0]!r}, not {expect!r}", "", "the engine stops")
        return msg[1]

    def check(self, grace: float = 0.0) -> None:
        """Raise WorkerDied if a rank has ended or failed a step, looking for up to `grace` seconds (a step that
        failed here may have seen a rank's end before its process is gone)."""
        deadline = time.monotonic() + grace
        while True:
            for r, link in self.links.items():
                if link.wait(0):
                    self._answer(r, None)
                gone = link.gone()
                if gone is not None:
                    raise WorkerDied(f"tensor-parallel rank {r} died ({gone})", "", "the engine stops")
            if time.monotonic() >= deadline:
                return
            time.sleep(POLL_S)

    def launch(self, node: str, walk: str, rung: int | None, size: int, inputs: dict, layouts: dict) -> None:
        """Start the same node step on every other rank: the message, then the broadcast of what is on the
        engine's GPU. Call it right before this rank runs the step."""
        self.check()
        host, sent, named = {}, [], {}
        for port, v in inputs.items():
            if isinstance(v, torch.Tensor) and id(v) in self.names:
                named[port] = self.names[id(v)]
            elif isinstance(v, torch.Tensor) and v.device.type != "cpu":
                sent.append((port, v.contiguous()))
            else:
                host[port] = v
        shapes = [(port, tuple(v.shape), DTYPES[v.dtype]) for port, v in sent]
        for r, link in self.links.items():
            try:
                link.request(("run", node, walk, rung, size, host, layouts, shapes, named))
            except OSError:                         # its end of the connection is closed
                self.check(grace=2.0)
                raise WorkerDied(f"tensor-parallel rank {r} closed its connection", "", "the engine stops") from None
        for _, v in sent:
            dist.broadcast(v, src=0)

    def ran(self, node: str, out: dict) -> None:
        """This rank's outputs of a node step, which a later step may name (their ids stay theirs while held)."""
        self.held[node] = out
        self.names = {id(t): (n, p) for n, outs in self.held.items() for p, t in outs.items()}

    def close(self) -> None:
        for link in self.links.values():
            link.close()
        self.links = {}
        if dist.is_initialized():
            dist.destroy_process_group()


class RankWorker:
    """A rank's process: join, boot, then run each node step the engine sends, until stop."""

    def __init__(self, rank: int):
        self.rank, self.runner, self.outputs = rank, None, {}

    def handle(self, msg):
        kind = msg[0]
        if kind == "join":
            _, init, world = msg
            join_group(init, world, self.rank, self._device())
            return "ready", None
        if kind == "boot":
            return "booted", self._boot(*msg[1:])
        if kind == "run":
            self._run(*msg[1:])
            return None
        if kind == "stop":
            return None
        raise ValueError(f"unknown message {kind!r}")

    def _device(self) -> torch.device:
        return torch.device("cuda", 0) if os.environ.get("CUDA_VISIBLE_DEVICES") else torch.device("cpu")

    def _boot(self, plan_json: str, opts: dict) -> dict:
        from graphc.runtime.boot import boot_plan
        from graphc.runtime.executor import NodeRunner, scratch_pages

        plan = Plan.model_validate_json(plan_json)
        boot = boot_plan(plan, rank=self.rank, **opts)[0]
        scratch = scratch_pages(boot)
        self.runner = NodeRunner(boot, scratch)
        return {"graphs": len(boot.graphs), "faults": list(boot.faults), "pid": os.getpid(), "scratch": scratch,
                "check": verdict(compare(boot))}

    def _run(self, node: str, walk: str, rung, size: int, host: dict, layouts: dict, shapes: list, named: dict):
        inputs = dict(host)
        for port, shape, dtype in shapes:
            t = torch.empty(shape, dtype=TORCH_DTYPES[dtype], device=self.runner.boot.device)
            dist.broadcast(t, src=0)
            inputs[port] = t
        for port, (src, sport) in named.items():
            inputs[port] = self.outputs[src][sport]
        self.outputs[node] = self.runner.run_node(node, walk, rung, size, inputs, layouts)


def rank_main(address: str, rank: int) -> None:
    """A rank's process: answer the engine's messages until stop, a failure, or the engine gone."""
    answer_messages(connect(address, rank), RankWorker(rank).handle)


if __name__ == "__main__":
    rank_main(sys.argv[1], int(sys.argv[2]))
