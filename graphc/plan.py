"""The Plan: what `graphc plan` writes and `graphc run` boots. YAML, strictly validated on load;
loading never executes code from the file. The fingerprint covers everything else in it."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from graphc.errors import InvalidInput
from graphc.stages import Pipeline
from graphc.strict import Strict, explain_validation, read_yaml

FORMAT = "graphc.plan/1"


class PlanModel(Strict):
    name: str
    file: str
    sha256: str
    preset: str
    config_sha256: str | None = None      # declared from a checkpoint's config.json: its hash and content
    config: dict[str, Any] | None = None


class PlanTarget(Strict):
    gpu: str
    count: int
    arch: str
    capacity_bytes: int                   # one device's
    memory_source: str
    num_sms: int
    host_bytes: int | None = None         # devices in one host's memory (cpu): the host's budget they split


def parse_graph_id(gid: str) -> tuple[str, str, int]:
    """A captured graph's name in a plan, 'node/family/rung' (emit_plan.graph_id), -> (node, family, rung)."""
    node, rest = gid.split("/", 1)
    family, rung = rest.rsplit("/", 1)
    return node, family, int(rung)


class PlanDevice(Strict):
    index: int
    nodes: list[str]
    ledger: dict[str, int]
    sources: dict[str, str]
    total_bytes: int
    capacity_bytes: int
    free_bytes: int
    kv_pages: dict[str, int]
    capture_order: list[str]
    # convolutions the runtime runs once before allocating, so cuDNN keeps the engines whose
    # workspaces were measured (graphc/convws.py); empty on CPU targets
    conv_engines: list[str] = []
    # what the device's worker holds in its host's memory (GPU targets; graphc/passes/size_host.py), with
    # where each line comes from; `graphc run` checks the devices of one host against what it has
    host: dict[str, int] = {}
    host_sources: dict[str, str] = {}
    # stream lanes (graphc/lanes.py): lane -> its nodes here, whose steps run on a CUDA stream of their own and
    # whose graphs are captured into a pool of their own (ledger line capture_pool.<lane>); empty: one stream
    lanes: dict[str, list[str]] = {}

    @property
    def host_total(self) -> int:
        """Host bytes of this device's worker: its host lines, or its whole ledger on a CPU target."""
        return sum(self.host.values()) if self.host else self.total_bytes


class PlanWalkBuckets(Strict):
    axis: str
    budget: int
    rungs: list[int]
    captured: list[int]
    eager_above: int | None
    why: str


class PlanNode(Strict):
    device: int
    module: str
    dtype: str
    weights_bytes: int
    num_params: int
    arena_bytes: int
    resources: dict[str, str]
    buckets: dict[str, PlanWalkBuckets]
    graphs: dict[str, list[int]]
    kernels: dict[str, int] = {}        # kernel choices for the node's modules (graphc.modules.KERNEL_KNOBS)


class PlanResource(Strict):
    kind: str
    backend: str | None
    devices: list[int]
    bytes: int
    why: str
    pages: dict[int, int] | None = None
    page_bytes: int | None = None
    max_seq_len: int | None = None
    min_pages: int | None = None
    workspace: str | None = None
    decode_backend: str | None = None
    run_head_dim: int | None = None     # set when the kernels run the head dim zero-padded
    slots: int | None = None            # linear_state: slots on each of its devices (the padding slot included)
    slot_bytes: int | None = None       # linear_state: one sequence's state in every layer


class PlanWalk(Strict):
    kind: str
    path: list[str]
    budget: dict[str, int]
    capture: bool


class PlanTrim(Strict):
    change: str
    freed_bytes: int
    why: str


class Plan(Strict):
    format: str
    model: PlanModel
    target: PlanTarget
    versions: dict[str, str]
    overrides: dict[str, Any]
    trimmed: list[PlanTrim]
    replicas: int = Field(1, ge=1)            # copies of `devices`, each served alone on its own devices
    # ranks of one copy, each on a device of its own with `devices`' one ledger: the model declared for one rank
    # (declare(tp=N): every node's heads and MLP divided), every rank running every step
    tensor_parallel: int = Field(1, ge=1)
    placement: str
    devices: list[PlanDevice]
    nodes: dict[str, PlanNode]
    resources: dict[str, PlanResource]
    walks: dict[str, PlanWalk]
    requests: dict[str, list[str | list[str]]]
    pipeline: Pipeline | None = None          # how `graphc run` serves it; plans of models that declare none lack it
    fingerprint: str

    @model_validator(mode="after")
    def _one_rank_ledger(self) -> "Plan":
        """A tensor-parallel plan is one copy whose every rank holds its one device's ledger."""
        if self.tensor_parallel > 1 and (self.replicas > 1 or len(self.devices) != 1
                                         or self.target.count != self.tensor_parallel):
            raise ValueError(f"tensor_parallel {self.tensor_parallel} needs one replica, one device's ledger and "
                             f"target.count {self.tensor_parallel}; the plan has {self.replicas} replica(s), "
                             f"{len(self.devices)} device(s), count {self.target.count}")
        return self

    def dump(self) -> dict:
        data = self.model_dump(mode="json")
        if data["model"]["config"] is None:          # plans of presets carry no checkpoint config
            del data["model"]["config"], data["model"]["config_sha256"]
        if data["pipeline"] is None:
            del data["pipeline"]
        if data["replicas"] == 1:                    # one copy: plans say nothing (older plans too)
            del data["replicas"]
        if data["tensor_parallel"] == 1:             # not split: plans say nothing
            del data["tensor_parallel"]
        if data["target"]["host_bytes"] is None:      # GPU plans: each card has its own memory
            del data["target"]["host_bytes"]
        for res in data["resources"].values():        # only linear_state resources have slots
            if res["slots"] is None:
                del res["slots"], res["slot_bytes"]
        for node in data["nodes"].values():           # nodes with no kernel choice say nothing (older plans too)
            if not node["kernels"]:
                del node["kernels"]
        for dev in data["devices"]:                   # one stream: plans say nothing (older plans too)
            if not dev["lanes"]:
                del dev["lanes"]
        return data

    def body(self) -> dict:
        data = self.dump()
        data.pop("fingerprint")
        return data

    def to_yaml(self) -> str:
        return dump_yaml(self.dump(), sort_keys=False, width=120)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml())


def dump_yaml(data, **kw) -> str:
    """yaml.safe_dump's text, by libyaml's emitter where PyYAML has it (five times faster than its Python one;
    the same text for every shipped plan: tests/unit/test_plan_file.py)."""
    fast = getattr(yaml, "CSafeDumper", None)
    return yaml.dump(data, Dumper=fast, **kw) if fast is not None else yaml.safe_dump(data, **kw)


def fingerprint(body: dict) -> str:
    """The plan's fingerprint: sha256 of the YAML dump of its body, keys sorted (dump_yaml)."""
    return hashlib.sha256(dump_yaml(body, sort_keys=True).encode()).hexdigest()


def has_fingerprint(body: dict, want: str) -> bool:
    """fingerprint(body) == want, or equal to the fingerprint of PyYAML's Python dump (a plan written where
    PyYAML had no libyaml, if ever the two emitters' texts differ)."""
    if fingerprint(body) == want:
        return True
    return hashlib.sha256(yaml.safe_dump(body, sort_keys=True).encode()).hexdigest() == want


def load_plan(path: str | Path) -> Plan:
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise InvalidInput(f"cannot read plan {path}", str(e), "check the path") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"plan {path} is not a text file", f"byte {e.start} is not UTF-8 ({raw[e.start:e.start + 1]!r})",
                           "pass a plan written by graphc plan") from None
    data = read_yaml(text, f"plan {path}", "regenerate it with graphc plan")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise InvalidInput(f"{path} is not a {FORMAT} plan", f"its format is {got!r}", "regenerate it with graphc plan")
    try:
        plan = Plan.model_validate(data)
    except ValidationError as e:
        raise explain_validation(e, f"plan {path}") from None
    if not has_fingerprint(plan.body(), plan.fingerprint):
        raise InvalidInput(f"plan {path} was edited after it was compiled", "its fingerprint does not match its content",
                           "regenerate it with graphc plan (use --set/--config to change settings)")
    return plan


def check_servable(plan: Plan, where: str = "this plan") -> None:
    """Refuse, before anything is loaded, a plan the engine cannot serve: one that records no pipeline, or
    whose walks and request kinds break what its pipeline's stages need (graphc/stages.py's rules, the
    ones `graphc plan` checked)."""
    from graphc.stages import problems, walk_table

    if plan.pipeline is None:
        raise InvalidInput(f"{where} records no serving pipeline", f"model {plan.model.name} declares none, or the "
                           "plan was made before pipelines were recorded",
                           "declare a graphc.Pipeline in the model file and plan it again")
    kinds = {k: [w for st in stages for w in ([st] if isinstance(st, str) else st)]
             for k, stages in plan.requests.items()}
    found = problems(plan.pipeline, walk_table(plan.walks.items()), kinds)
    if found:
        raise InvalidInput(f"{where} cannot be served: its walks break what its pipeline needs", "; ".join(found),
                           "plan it again with graphc plan (its checks refuse such walks; its remedies avoid them)")


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
