"""`graphc run PLAN --ray ADDRESS`: a plan's devices as Ray actors, on one host or several (issue 12).

One placement group holds a bundle per plan device (one GPU each; one CPU each for a CPU plan), ranks
are the plan's device indices. Each device other than the LLM node's gets a worker actor
(workers.DeviceWorker, the same messages a worker process answers); the LLM node's device gets the
engine's actor, which holds the scheduler and drives the others. This process (the driver) reads the
requests, hands them to the engine's actor and writes what comes back; or it starts the server in the
engine's actor and waits on it.

    strategy      STRICT_PACK for a GPU plan: its devices were planned as GPUs of one host, and the
                  tensors that cross them every step go device to device (NCCL over NVLink or PCIe);
                  PACK for a CPU plan (gloo goes over any network).
    rendezvous    torch.distributed at rank 0 (plan device 0): its actor names an address on its node.
    a dead actor  the engine's WorkerDied, as for a worker process: what is in flight fails, the device
                  is named, graphc run exits 3. The driver names a dead engine actor the same way.

Every actor runs in a Ray worker process of the cluster's own Python environment: graphc (and the
checkpoint directory, at the same path) must be there on each host.
"""
from __future__ import annotations

import os
import threading

from graphc.errors import GraphcError, InvalidInput
from graphc.plan import Plan
from graphc.runtime.batch import run_batch
from graphc.runtime.progress import shown
from graphc.runtime.workers import STEP_TIMEOUT_S, DeviceWorker, WorkerDied

PG_TIMEOUT_S = 120.0           # the longest to wait for the cluster to hold the plan's bundles


def import_ray():
    try:
        import ray
    except ImportError:
        raise InvalidInput("--ray needs Ray, which is not installed", "Ray is an optional extra of graphc",
                           "pip install 'graphc[ray]' (or serve on one host without --ray)") from None
    return ray


def strategy(plan: Plan) -> str:
    """STRICT_PACK where the plan's devices must share a host (its GPUs), PACK otherwise."""
    return "PACK" if plan.target.arch == "cpu" else "STRICT_PACK"


def bundles(plan: Plan) -> list[dict]:
    """A bundle per plan device, in rank order."""
    return [{"CPU": 1} if plan.target.arch == "cpu" else {"GPU": 1, "CPU": 1} for _ in plan.devices]


def node_devices(plan: Plan, bundle_nodes: dict[int, str]) -> dict[str, list[int]]:
    """Ray node id -> the plan devices whose bundles it holds (bundle i is device i)."""
    out: dict[str, list[int]] = {}
    for d in plan.devices:
        out.setdefault(bundle_nodes[d.index], []).append(d.index)
    return out


def check_nodes(ray, plan: Plan, pg) -> None:
    """A cpu plan's devices live in their Ray nodes' memory, a GPU plan's workers hold their host lines there:
    before any actor boots, each node's devices together must fit what that node has available now
    (hostmem.check_host_memory, read on the node)."""
    if plan.target.host_bytes is None and not any(d.host for d in plan.devices):
        return
    from ray.util import placement_group_table
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from graphc.hostmem import available_bytes, check_host_memory

    here = ray.get_runtime_context().get_node_id()
    groups = node_devices(plan, placement_group_table(pg)["bundles_to_node_id"])
    for node, devices in groups.items():
        if node == here:
            have = available_bytes()
        else:
            read = ray.remote(num_cpus=0)(available_bytes)
            have = ray.get(read.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote())
        check_host_memory(plan, f"the plan's devices {devices} on Ray node {node[:12]}", have, devices)


class RayLink:
    """The engine's side of a worker actor: the same messages as a worker process's connection."""

    kinds = "Ray actors"

    def __init__(self, actor):
        self.ray = import_ray()
        self.actor = actor
        self.ref = None
        self.watch = actor.watch.remote()             # resolves when the actor stops, raises if it dies

    def request(self, msg) -> None:
        self.ref = self.actor.handle.remote(msg)

    def wait(self, timeout: float) -> bool:
        return bool(self.ray.wait([self.ref], timeout=timeout)[0])

    def answer(self):
        try:
            return self.ray.get(self.ref)
        except self.ray.exceptions.RayError as e:
            return "gone", f"its Ray actor died: {str(e).strip().splitlines()[0]}"

    def gone(self) -> str | None:
        if not self.ray.wait([self.watch], timeout=0)[0]:
            return None
        try:
            self.ray.get(self.watch)
        except self.ray.exceptions.RayError as e:
            return f"its Ray actor died: {str(e).strip().splitlines()[0]}"
        return "its Ray actor stopped"

    def close(self) -> None:
        try:
            self.ray.get(self.actor.handle.remote(("stop",)), timeout=10)
        except Exception:                             # dead or stuck: killed below either way
            pass
        self.ray.kill(self.actor)


def _classes(ray):
    """The actor classes (Ray is imported only for --ray)."""

    @ray.remote(concurrency_groups={"watch": 1})
    class DeviceActor:
        """A plan device's worker: DeviceWorker's messages, one at a time, in order."""

        def __init__(self, index: int):
            self.worker = DeviceWorker(index)
            self.stopped = threading.Event()

        def handle(self, msg):
            if msg[0] == "address" and msg[1] is None:       # rank 0's rendezvous, on this actor's node
                msg = ("address", ray.util.get_node_ip_address())
            reply = self.worker.handle(msg)
            if msg[0] == "stop":
                self.stopped.set()
            return reply

        @ray.method(concurrency_group="watch")
        def watch(self) -> bool:
            self.stopped.wait()
            return True

    return DeviceActor, _engine_actor(ray)


def _engine_actor(ray):
    """The engine's actor class."""

    @ray.remote
    class EngineActor:
        """The LLM node's device: the engine, driving the other devices' actors."""

        def __init__(self, plan_json: str, actors: dict, options: dict, quiet: bool):
            from graphc.runtime.engine import Engine

            links = {d: RayLink(a) for d, a in actors.items()}
            with shown(quiet):          # its boot's lines, which Ray shows prefixed with the actor (progress.py)
                self.engine = Engine(Plan.model_validate_json(plan_json), links=links,
                                     host=ray.util.get_node_ip_address(), **options)

        def summary(self) -> str:
            return self.engine.summary()

        def media_limits(self):
            return self.engine.media_limits()

        def generate(self, parsed: list):
            """batch.run_batch's (outputs, stats, their line), or ('dead', what, why, fix) when a device's worker
            died."""
            try:
                return run_batch(self.engine, parsed)
            except WorkerDied as e:
                return "dead", e.what, e.why, e.fix

        def serve(self, host: str, port: int, **kwargs):
            """None when the server stops, or ('dead', what, why, fix) when a device's worker died."""
            from graphc.serve import serve
            e = serve(self.engine, host, port, exit_on_death=False, **kwargs)
            return None if e is None else ("dead", e.what, e.why, e.fix)

        def node_ip(self) -> str:
            return ray.util.get_node_ip_address()

        def close(self) -> None:
            self.engine.close()

    return EngineActor


class RayServing:
    """A plan's devices as actors of the Ray cluster at `address` ('local': start one in this process)."""

    def __init__(self, plan: Plan, address: str, *, llm_device: int, checkpoint: str | None = None,
                 random_weights: bool = False, seed: int = 0, emulate: bool = False, force: bool = False,
                 prefix_cache: bool = True, overlap: bool = True, default_max_tokens: int | None = None,
                 chat_template: str | None = None, tokenizer: str | None = None, quiet: bool = False,
                 audio_lead_ms: float | None = None):
        """quiet: the engine actor reports no boot phases (graphc run -q). The rest: the Engine's."""
        ray = self.ray = import_ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.plan, self.local = plan, llm_device
        self.started = not ray.is_initialized()
        if self.started:
            n = len(plan.devices)
            if address == "local":      # a cluster of this host; enough logical CPUs for a CPU plan's bundles
                ray.init(num_cpus=max(os.cpu_count() or 1, n + 1), include_dashboard=False)
            else:
                ray.init(address=address)
        self.pg = placement_group(bundles(plan), strategy=strategy(plan))
        self._remove = remove_placement_group
        try:
            if not ray.wait([self.pg.ready()], timeout=PG_TIMEOUT_S)[0]:
                have = {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
                raise InvalidInput(f"the Ray cluster at {address} did not hold the plan's {len(plan.devices)} "
                                   f"bundles ({bundles(plan)[0]} each, {strategy(plan)}) in {PG_TIMEOUT_S:.0f} s",
                                   f"it has {have} available",
                                   "add nodes or GPUs to the cluster, or plan for fewer devices")
            check_nodes(ray, plan, self.pg)
            DeviceActor, EngineActor = _classes(ray)
            gpu = plan.target.arch != "cpu"

            def place(d: int) -> dict:
                return {"num_cpus": 1, "num_gpus": 1 if gpu else 0, "name": f"graphc-device-{d}-{os.getpid()}",
                        "scheduling_strategy": PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=d)}

            self.actors = {d.index: DeviceActor.options(**place(d.index)).remote(d.index)
                           for d in plan.devices if d.index != llm_device}
            options = {"checkpoint": checkpoint, "random_weights": random_weights, "seed": seed, "emulate": emulate,
                       "prefix_cache": prefix_cache, "overlap": overlap, "force": force,
                       "default_max_tokens": default_max_tokens, "chat_template": chat_template,
                       "tokenizer": tokenizer, "audio_lead_ms": audio_lead_ms}
            self.engine = EngineActor.options(**place(llm_device)).remote(plan.model_dump_json(), self.actors, options, quiet)
            self.summary = self._get(self.engine.summary.remote(), None)
        except BaseException:
            self.close()
            raise

    def _get(self, ref, timeout: float | None):
        """ray.get, with the engine's actor dying named by its device (WorkerDied) and the engine's own
        refusals (InvalidInput, with the numbers) passed on as they were raised."""
        ray = self.ray
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.RayActorError as e:
            raise WorkerDied(f"the engine's actor (device {self.local}) died", str(e).strip().splitlines()[0],
                             "see its output above; graphc run stops") from None
        except ray.exceptions.RayTaskError as e:
            if isinstance(getattr(e, "cause", None), GraphcError):
                raise e.cause from None
            raise                                     # a bug: its remote traceback
        except ray.exceptions.RayError as e:         # killed for memory by Ray, its node lost, ...
            raise WorkerDied(f"the engine's actor (device {self.local}) ended", str(e).strip().splitlines()[0],
                             "see its output above; graphc run stops") from None

    def generate(self, parsed: list):
        """Engine.run_parsed on the engine's actor: (outputs, stats, their line); WorkerDied if a device's
        worker died on the way."""
        got = self._get(self.engine.generate.remote(parsed), None)
        if got[0] == "dead":
            raise WorkerDied(*got[1:])
        return got

    def serve(self, host: str, port: int, **kwargs) -> None:
        """The server, in the engine's actor, until it stops; WorkerDied if a device's worker died."""
        got = self._get(self.engine.serve.remote(host, port, **kwargs), None)
        if got is not None:
            raise WorkerDied(*got[1:])

    def node_ip(self) -> str:
        return self._get(self.engine.node_ip.remote(), STEP_TIMEOUT_S)

    def media_limits(self):
        """The engine's media limits (inputs.Limits), for loading the requests' media here."""
        return self._get(self.engine.media_limits.remote(), STEP_TIMEOUT_S)

    def close(self) -> None:
        ray = self.ray
        engine = getattr(self, "engine", None)
        if engine is not None:
            try:
                ray.get(engine.close.remote(), timeout=30)
            except Exception:
                pass
            ray.kill(engine)
        for a in getattr(self, "actors", {}).values():
            ray.kill(a)
        try:
            self._remove(self.pg)
        except Exception:
            pass
        if self.started:
            ray.shutdown()
