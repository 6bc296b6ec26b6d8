"""A plan of R replicas (graphc/passes/choose_layout.py): an Engine per replica, each on its own device
(GPU r, or this CPU), stepped by its own thread, with requests routed to the replica that has the most
free decode slots, then the most free KV pages. Nothing crosses replicas within a step.

Replicas has the surface of one Engine that `graphc run` and the server read (graphc/serve/router.py
fronts it for the server); the offline run steps the replicas side by side."""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

from graphc.errors import InvalidInput
from graphc.plan import Plan, load_plan
from graphc.runtime.engine import Engine, Output, refused
from graphc.runtime.progress import log


def pick(loads: list[dict]) -> int:
    """The replica a new request goes to. Free decode slots: the most sequences its decode walk runs, less
    those running, waiting and handed to it but not yet taken. Among the replicas with a free slot, the one
    whose prefix cache holds the most of the request's first rows (`cached`); then the most free slots, then
    the most free KV pages; the lowest index on a tie."""
    def rank(i: int) -> tuple:
        x = loads[i]
        free = x["max_running"] - x["running"] - x["waiting"] - x.get("pending", 0)
        return free > 0, x.get("cached", 0) if free > 0 else 0, free, x["free_pages"], -i
    return max(range(len(loads)), key=rank)


def on_device(engine: Engine):
    """A context in which this thread's CUDA calls go to the engine's GPU (a thread starts on GPU 0)."""
    device = engine.boot.device
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


class Replicas:
    """An Engine per replica of the plan; the Engine surface graphc run and the server read."""

    def __init__(self, plan: str | Path | Plan, checkpoint: str | Path | None = None, **opts):
        self.plan = plan if isinstance(plan, Plan) else load_plan(plan)
        if self.plan.replicas < 2:
            raise InvalidInput("the plan has one copy", "Replicas serves plans of several", "serve it with Engine")
        if self.plan.target.arch != "cpu" and torch.cuda.is_available():
            have = torch.cuda.device_count()
            if have < self.plan.replicas:
                raise InvalidInput(f"the plan runs {self.plan.replicas} replicas, one a GPU; this machine shows {have}",
                                   "each replica needs a GPU of its own",
                                   f"run it where {self.plan.replicas} GPUs are visible, or plan with --gpus {have}")
        t0 = time.perf_counter()
        self.engines: list[Engine] = []
        for r in range(self.plan.replicas):
            log.info("boot replica %d: replica %d of %d", r, r + 1, self.plan.replicas)     # graphc/runtime/progress.py
            on_gpu = self.plan.target.arch != "cpu" and torch.cuda.is_available()
            with torch.cuda.device(r) if on_gpu else nullcontext():
                self.engines.append(Engine(self.plan, checkpoint, replica=r, **opts))
        self.boot_seconds = time.perf_counter() - t0
        self.lock = threading.Lock()           # routing reads loads while the replicas' threads step

    # ---- what every replica has alike (one plan)
    def __getattr__(self, name: str):
        if name in ("model_name", "max_seq_len", "speaks", "sample_rate", "transcription", "tokenizer", "template",
                    "kinds", "media_limits", "tokenize", "host", "model"):
            return getattr(self.engines[0], name)
        raise AttributeError(name)

    @property
    def max_running(self) -> int:
        return sum(e.max_running for e in self.engines)

    @property
    def has_workers(self) -> bool:
        return False

    def load(self) -> dict[str, int]:
        """The replicas' loads summed (Engine.load's keys)."""
        out: dict[str, int] = {}
        for e in self.engines:
            for k, v in e.load().items():
                out[k] = out.get(k, 0) + v
        return out

    def loads(self, pending: list[int] | None = None) -> list[dict]:
        """Each replica's load with its decode slots, for pick()."""
        return [e.load() | {"max_running": e.max_running, "pending": pending[i] if pending else 0}
                for i, e in enumerate(self.engines)]

    def route(self, request_id: str | None = None, pending: list[int] | None = None, item: dict | None = None) -> int:
        """The replica for a new request: the one holding its id already (it refuses the duplicate), else pick(),
        told how many of the request's first text rows (item: Engine.add's keywords) each replica has cached."""
        if request_id is not None:
            for i, e in enumerate(self.engines):
                if e.request(request_id) is not None:
                    return i
        loads = self.loads(pending)
        text = self.text_prefix(item) if item is not None else None
        if text is not None:
            for x, e in zip(loads, self.engines):
                x["cached"] = e.scheduler.cached_rows(*text)
        return pick(loads)

    def text_prefix(self, item: dict) -> tuple[list[int], int] | None:
        """(ids, rows): a request's prompt ids up to its first media placeholder, and how many of them its
        prefill could take from a cache (all of them before media, else all but the last); None where the
        prompt cannot be read here (the engine that takes it reads it again, and refuses it with the reason)."""
        ids = item.get("prompt_token_ids")
        if ids is None:
            try:
                ids = self.engines[0].tokenize(item.get("messages"), item.get("prompt"))
            except Exception:        # a hint only: Engine.add raises the same, where the caller hears of it
                return None
        marks = set(getattr(self.engines[0].host, "token_of", {}).values())
        cut = next((i for i, t in enumerate(ids) if t in marks), None)
        return (list(ids), len(ids) - 1) if cut is None else (list(ids[:cut]), cut)

    def close(self) -> None:
        for e in self.engines:
            e.close()

    def summary(self) -> str:
        lines = [f"graphc run: {self.plan.replicas} replicas of the plan, booted in {self.boot_seconds:.1f} s; "
                 "requests go to a replica with a free decode slot that has cached most of the prompt, then the "
                 "most free slots, then KV pages"]
        lines += [f"replica {r}: " + e.summary() for r, e in enumerate(self.engines)]
        return "\n".join(lines)

    def device_memory(self) -> dict[int, dict]:
        return {r: e.device_memory()[e.boot.index] for r, e in enumerate(self.engines)}

    def stats(self, wall_s: float | None = None) -> dict:
        """Engine.stats of each replica under `replicas`, and their counts summed (devices keyed by replica; the
        prefix and media caches' counts and sizes too, so that /metrics shows the whole server's)."""
        per = [e.stats() for e in self.engines]
        out = {"steps": _sum(p["steps"] for p in per), "rungs": _sum(p["rungs"] for p in per),
               "preemptions": sum(p["preemptions"] for p in per), "replayed": sum(p["replayed"] for p in per),
               "eager": sum(p["eager"] for p in per), "devices": {str(r): p["devices"]["0"] for r, p in enumerate(per)},
               "replicas": per}
        caches = [p["prefix_cache"] for p in per if "prefix_cache" in p]
        if caches:                                 # every replica's, or none: one plan
            out["prefix_cache"] = _sum({k: v for k, v in c.items() if k != "follow_rows"} for c in caches)
            if all("follow_rows" in c for c in caches):
                out["prefix_cache"]["follow_rows"] = _sum(c["follow_rows"] for c in caches)
        media = [p["media_cache"] for p in per if "media_cache" in p]
        if media:
            out["media_cache"] = {node: _sum(m[node] for m in media) for node in media[0]}
        if wall_s is not None:
            out["wall_s"] = wall_s
        return out

    stats_line = staticmethod(Engine.stats_line)

    # ---- offline
    def generate(self, items: list[dict], progress: bool = False) -> list[Output]:
        """Engine.generate over the replicas."""
        from graphc.runtime.engine import parse_or_refuse

        return self.run_parsed([parse_or_refuse(item, i) for i, item in enumerate(items)], progress)

    def run_parsed(self, parsed: list, progress: bool = False, stop: Callable[[], bool] = lambda: False
                   ) -> list[Output]:
        """Engine.run_parsed over the replicas: each request routed as it is added, then every replica
        stepped to its end by a thread of its own. stop: as Engine.run_parsed's, asked by each thread before
        each of its steps."""
        from tqdm import tqdm

        reqs, owner = [], []
        for i, item in enumerate(parsed):
            if isinstance(item, Output):
                reqs.append(item)
                owner.append(None)
                continue
            r = self.route(item.get("request_id"), item=item)
            try:
                reqs.append(self.engines[r].add(**item))
                owner.append(r)
            except InvalidInput as e:
                reqs.append(refused(item.get("request_id") or f"line-{i}", e))
                owner.append(None)
        live = sum(o is not None for o in owner)
        with tqdm(total=live, desc="requests", unit="req", file=sys.stderr, disable=not progress) as bar:
            self._step_all(bar, stop)
        return [self.engines[o].output(q) if o is not None else q for q, o in zip(reqs, owner)]

    def _step_all(self, bar, stop: Callable[[], bool]) -> None:
        errors: list[BaseException] = []

        def drain(e: Engine) -> None:
            try:
                with on_device(e):
                    while e.has_work():
                        if stop():
                            raise KeyboardInterrupt
                        done = sum(ev.finished for ev in e.step())
                        if done:
                            with self.lock:
                                bar.update(done)
            except BaseException as x:       # raised again in the caller's thread
                errors.append(x)

        threads = [threading.Thread(target=drain, args=(e,), name=f"graphc-replica-{r}")
                   for r, e in enumerate(self.engines)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]


def _sum(dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out
