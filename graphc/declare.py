"""The declaration types a model file builds: Model, Node, Port, Edge, Walk, Budget, RequestKind."""
from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from typing import Any, ClassVar, Literal

from pydantic import Field, SerializeAsAny, field_validator, model_validator

from graphc.stages import Pipeline, problems, walk_table
from graphc.strict import Strict
from graphc.units import DTYPE_BYTES
from resources.base import ResourceSpec

AXES: tuple[str, ...] = ("tokens", "seqs", "windows", "patches", "frames", "segments")
Axis = Literal["tokens", "seqs", "windows", "patches", "frames", "segments"]
DType = Literal["float32", "bfloat16", "float16", "int64", "int32", "bool", "uint8"]
FloatDType = Literal["float32", "bfloat16", "float16"]
WalkKind = Literal["decode", "prefill", "mixed", "encode", "chunk"]


_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_DIM = re.compile(r"^(?P<axis>[a-z]+)((?P<op>[*/])(?P<k>[1-9][0-9]*))?$")


def parse_dim(dim: int | str) -> tuple[str | None, int, int]:
    """A port dimension -> (axis, mul, div): an int, 'axis', 'axis*K' or 'axis/K' (ceil)."""
    if isinstance(dim, int):
        return None, dim, 1
    m = _DIM.match(dim)
    if not m or m["axis"] not in AXES:
        raise ValueError(f"dimension '{dim}' is neither an int nor AXIS, AXIS*K or AXIS/K with AXIS in {AXES}")
    k = int(m["k"] or 1)
    return (m["axis"], k, 1) if m["op"] != "/" else (m["axis"], 1, k)


def dim_size(dim: int | str, sizes: dict[str, int]) -> int:
    axis, mul, div = parse_dim(dim)
    return mul if axis is None else -(-sizes[axis] * mul // div)


class Port(Strict):
    """A typed tensor input or output of a node; symbolic dims name a capture axis."""

    shape: tuple[int | str, ...]
    dtype: DType
    optional: str | None = None   # optional group: its ports are fed together on walks that feed one

    @field_validator("shape")
    @classmethod
    def _dims(cls, shape: tuple) -> tuple:
        for d in shape:
            if isinstance(d, int) and d < 1:
                raise ValueError(f"dimension {d} must be >= 1")
            parse_dim(d)
        return shape

    def axes(self) -> set[str]:
        return {parse_dim(d)[0] for d in self.shape} - {None}

    def concrete(self, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(dim_size(d, sizes) for d in self.shape)

    def nbytes(self, sizes: dict[str, int]) -> int:
        n = DTYPE_BYTES[self.dtype]
        for d in self.concrete(sizes):
            n *= d
        return n


class Budget(Strict):
    """The most one step of a walk may carry, per axis. segments: the segments (images, a clip's frame groups)
    an encoder's ragged attention takes in one step, where they are not its sequences: without it, seqs
    bounds both the LLM's sequences and the encoder's segments."""

    tokens: int | None = Field(None, ge=1)
    seqs: int | None = Field(None, ge=1)
    windows: int | None = Field(None, ge=1)
    patches: int | None = Field(None, ge=1)
    frames: int | None = Field(None, ge=1)
    segments: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _some_axis(self) -> "Budget":
        if not self.axes():
            raise ValueError(f"a budget needs at least one axis of {AXES}")
        return self

    def axes(self) -> dict[str, int]:
        return {a: getattr(self, a) for a in AXES if getattr(self, a) is not None}


_REF = re.compile(r"^(?P<module>[A-Za-z_]\w*(\.[A-Za-z_]\w*)*):(?P<qualname>[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)$")


def _is_nn_module(obj: Any) -> bool:
    """A torch.nn.Module subclass, asked without importing torch: whatever defines one has imported it."""
    torch = sys.modules.get("torch")
    return isinstance(obj, type) and torch is not None and issubclass(obj, torch.nn.Module)


class ModuleRef(str):
    """A node's module named by import path, 'package.module:Class', imported when the node is first built:
    a plan whose traces are all in the disk cache (graphc/memo.py) imports neither it nor torch."""

    @classmethod
    def parse(cls, text: str) -> "ModuleRef":
        m = _REF.match(text)
        if not m:
            raise ValueError(f"module '{text}' is neither a torch.nn.Module subclass nor 'package.module:Class'")
        hint = "is its package on sys.path, or installed?"
        try:
            found = importlib.util.find_spec(m["module"])        # runs its parent packages' __init__, not it
        except (ImportError, ValueError) as e:
            raise ValueError(f"module '{text}': no module '{m['module']}' to import: {type(e).__name__}: {e} "
                             f"({hint})") from e
        if found is None or found.origin is None:
            raise ValueError(f"module '{text}': no module '{m['module']}' to import ({hint})")
        return cls(text)

    @property
    def python_module(self) -> str:
        """'package.module', the part before the colon."""
        return self.partition(":")[0]

    @property
    def dotted(self) -> str:
        """'package.module.Class', as a plan names a node's module."""
        return self.replace(":", ".")

    def resolve(self) -> type:
        """The class, imported now; refused unless it is a torch.nn.Module subclass."""
        from graphc.errors import InvalidInput

        try:
            obj: Any = importlib.import_module(self.python_module)
        except Exception as e:                  # the module's own code: the declaration's fault, said as such
            raise InvalidInput(f"module '{self}': importing {self.python_module} failed: {type(e).__name__}: {e}",
                               "a node's module is imported when the node is first built",
                               f"fix {self.python_module}, or name another module") from e
        for part in self.partition(":")[2].split("."):
            if not hasattr(obj, part):
                raise InvalidInput(f"module '{self}': {obj.__name__} has no attribute '{part}'",
                                   "a node names its module as 'package.module:Class'",
                                   "name a class the module defines")
            obj = getattr(obj, part)
        if not _is_nn_module(obj):
            raise InvalidInput(f"module '{self}' is {obj!r}, not a torch.nn.Module subclass",
                               "a node's module is built into the step's forward", "name an nn.Module subclass")
        return obj


class Node(Strict):
    """One module on one device with typed ports and the resources it calls by role. `module` is the
    nn.Module subclass or its import path, 'package.module:Class' (ModuleRef: imported when first built)."""

    name: str = Field(pattern=_NAME)
    module: Any
    config: Any = None
    inputs: dict[str, Port]
    outputs: dict[str, Port]
    resources: dict[str, str] = {}
    dtype: FloatDType = "bfloat16"
    weight_prefix: str = ""
    # checkpoint tensors under these prefixes are not loaded and not refused (a speculative head the engine does
    # not run, a tower the model is declared without)
    ignore_weights: tuple[str, ...] = ()
    device: int | None = Field(None, ge=0)

    @field_validator("module")
    @classmethod
    def _is_module(cls, module: Any) -> Any:
        if isinstance(module, str):
            return ModuleRef.parse(module)
        if not _is_nn_module(module):
            raise ValueError(f"module must be a torch.nn.Module subclass or 'package.module:Class', got {module!r}")
        return module

    @property
    def module_class(self) -> type:
        """The module's class (a ModuleRef is imported now)."""
        return self.module.resolve() if isinstance(self.module, ModuleRef) else self.module

    @property
    def module_name(self) -> str:
        """'package.module.Class' (the plan's name for it), without importing a ModuleRef."""
        m = self.module
        return m.dotted if isinstance(m, ModuleRef) else f"{m.__module__}.{m.__qualname__}"

    def build(self) -> Any:
        """The node's module (a torch.nn.Module), built on the current default device."""
        cls = self.module_class
        return cls(self.config) if self.config is not None else cls()


class Edge(Strict):
    """A dataflow edge 'node.port' -> 'node.port'."""

    src: str = Field(pattern=r"^[A-Za-z_]\w*\.[A-Za-z_]\w*$")
    dst: str = Field(pattern=r"^[A-Za-z_]\w*\.[A-Za-z_]\w*$")

    def ends(self) -> tuple[tuple[str, str], tuple[str, str]]:
        s, d = self.src.split("."), self.dst.split(".")
        return (s[0], s[1]), (d[0], d[1])


class Link(Strict):
    """A node the engine drives from another node's device: the runtime builds dst's `inputs` on src's
    device (a follow stage reads rows made from the LLM's embeddings and hidden states, its sampling
    rows and random draws) and reads dst's `outputs` there (its codes, an audio decoder's audio).
    Where a plan puts dst on another device than src, each of those ports crosses device to device into
    a static receive buffer on the far side, sized at dst's largest step: the ledger's `transfers.NODE`
    lines, as for an edge."""

    src: str = Field(pattern=_NAME)
    dst: str = Field(pattern=_NAME)
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()

    def input_key(self, port: str) -> tuple[str, str]:
        """(source, label) of a linked input's receive buffer: the ledger's transfers.SRC line names it 'dst.port'."""
        return self.src, f"{self.dst}.{port}"


class Walk(Strict):
    """What one engine step runs: a path through nodes, a kind of work and a budget.

    A "chunk" walk with a seqs budget carries whole slots of budget/seqs rows on its capture axis
    (an audio decoder's chunks): seqs at a rung counts the rung's slots, and its budget and rungs are whole slots.

    ladder: the capture rungs of every node on the path; ladders: a node's own, in place of the walk's (an
    encoder's patches and the LLM's rows on one walk grow by different steps)."""

    name: str = Field(pattern=_NAME)
    kind: WalkKind
    path: tuple[str, ...] = Field(min_length=1)
    budget: Budget
    capture: bool = True
    ladder: tuple[int, ...] | None = None
    ladders: dict[str, tuple[int, ...]] = {}
    axes: dict[str, Axis] = {}
    capture_limit: dict[str, int] = {}

    @field_validator("ladder")
    @classmethod
    def _ladder(cls, ladder: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if ladder is not None:
            _check_ladder(ladder, "ladder")
        return ladder

    @field_validator("ladders")
    @classmethod
    def _ladders(cls, ladders: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        for node, ladder in ladders.items():
            _check_ladder(ladder, f"ladders.{node}")
        return ladders

    def ladder_of(self, node: str) -> tuple[int, ...] | None:
        """The rungs a node's steps on this walk climb: its own ladder, else the walk's, else None (the
        default ladder)."""
        return self.ladders.get(node, self.ladder)


def _check_ladder(ladder: tuple[int, ...], where: str) -> None:
    if not ladder or any(r < 1 for r in ladder) or list(ladder) != sorted(set(ladder)):
        raise ValueError(f"{where} {list(ladder)} must be strictly increasing positive ints")


class RequestKind(Strict):
    """A request kind is a sequence of stages; a stage is one walk or walks that run side by side."""

    name: str = Field(pattern=_NAME)
    stages: tuple[str | tuple[str, ...], ...] = Field(min_length=1)

    def walks(self) -> list[str]:
        return [w for s in self.stages for w in ((s,) if isinstance(s, str) else s)]


def _missing_outputs(pipeline: Pipeline, nodes: dict) -> list[str]:
    """node.port for each output the engine reads from a stage's node and the node does not declare: the
    follow stage reads `reads` from the LLM's node, and its own `codes` and next_embeds; a chunk stage
    reads wav."""
    want = []
    if (follow := pipeline.follow) is not None:
        want += [(pipeline.llm.node, follow.reads), (follow.node, follow.codes), (follow.node, "next_embeds")]
    if (chunk := pipeline.chunk) is not None:
        want += [(chunk.node, "wav")]
    return [f"{n}.{port}" for n, port in want if port not in nodes[n].outputs]


class Model(Strict):
    """A whole declared model: what `declare()` in a model file returns."""

    KINDS: ClassVar[tuple[str, ...]] = ("nodes", "resources", "walks", "requests")

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    nodes: tuple[Node, ...] = Field(min_length=1)
    resources: tuple[SerializeAsAny[ResourceSpec], ...] = ()
    edges: tuple[Edge, ...] = ()
    links: tuple[Link, ...] = ()
    walks: tuple[Walk, ...] = Field(min_length=1)
    requests: tuple[RequestKind, ...] = ()
    pipeline: Pipeline | None = None      # how the engine serves it (graphc/stages.py); None: plan only

    @model_validator(mode="after")
    def _unique_names(self) -> "Model":
        for kind in self.KINDS:
            names = [x.name for x in getattr(self, kind)]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"duplicate {kind} names: {', '.join(dupes)}")
        return self

    @model_validator(mode="after")
    def _links_name_ports(self) -> "Model":
        nodes = {n.name: n for n in self.nodes}
        for link in self.links:
            where = f"link {link.src} -> {link.dst}"
            for name in (link.src, link.dst):
                if name not in nodes:
                    raise ValueError(f"{where} names unknown node '{name}' (nodes: {', '.join(nodes)})")
            if link.src == link.dst:
                raise ValueError(f"{where} links a node to itself: a link is between two nodes")
            dst = nodes[link.dst]
            for kind, ports, have in (("input", link.inputs, dst.inputs), ("output", link.outputs, dst.outputs)):
                bad = [p for p in ports if p not in have]
                if bad or len(set(ports)) != len(ports):
                    raise ValueError(f"{where}: {link.dst} has no {kind} {', '.join(bad)} or lists one twice "
                                     f"(its {kind}s: {', '.join(have)})")
            if not link.inputs and not link.outputs:
                raise ValueError(f"{where} names no port: list the inputs made on {link.src}'s device or the "
                                 "outputs read there")
        dsts = [link.dst for link in self.links]
        twice = sorted({d for d in dsts if dsts.count(d) > 1})
        if twice:
            raise ValueError(f"node(s) {', '.join(twice)} linked twice: one node drives each")
        return self

    @model_validator(mode="after")
    def _pipeline_serves(self) -> "Model":
        """The pipeline's stages name declared nodes and ports, and the walks and request kinds are what
        they need: a declaration (or an override, or a remedy) that breaks this is refused here."""
        if self.pipeline is None:
            return self
        nodes = {n.name: n for n in self.nodes}
        for s in self.pipeline.stages:
            if s.node not in nodes:
                raise ValueError(f"pipeline stage {s.name} names unknown node '{s.node}' (nodes: {', '.join(nodes)})")
        if bad := _missing_outputs(self.pipeline, nodes):
            raise ValueError(f"the pipeline reads output port(s) {', '.join(bad)}, which those nodes do not declare; "
                             "declare them in the nodes' outputs or name ports they have")
        found = problems(self.pipeline, walk_table(self.walks), {k.name: k.walks() for k in self.requests})
        if found:
            raise ValueError("the walks do not serve the declared pipeline: " + "; ".join(found))
        return self

    def node(self, name: str) -> Node:
        return _lookup(self.nodes, name, "node")

    def walk(self, name: str) -> Walk:
        return _lookup(self.walks, name, "walk")

    def resource(self, name: str) -> ResourceSpec:
        return _lookup(self.resources, name, "resource")


def _lookup(items: tuple, name: str, what: str) -> Any:
    for x in items:
        if x.name == name:
            return x
    from graphc.errors import InvalidInput
    from graphc.strict import closest

    names = [x.name for x in items]
    hint = closest(name, names)
    raise InvalidInput(f"unknown {what} '{name}'", f"declared {what}s: {', '.join(names)}",
                       f"use '{hint}'" if hint else f"use one of: {', '.join(names)}")
