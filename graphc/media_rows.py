"""The row caches' plan: which output rows each cache holds, a row's bytes, and how many rows each node gets.

Two kinds of node get a cache of their output rows on the LLM's device, each a ledger line `media_cache.<node>`:
- an encoder whose outputs the LLM reads (the declared edges into the pipeline's LLM node): repeated media's
  encoder rows (graphc/runtime/media_cache.py);
- the LLM, where a follow stage reads its output (the pipeline's follow.reads): those rows of the prompt rows the
  host names (graphc.Speech.hidden_rows), kept for the prefix cache's pages, so that a speaking request takes
  cached pages past them (graphc/runtime/follow_rows.py).
For each port read, a buffer with the port's row dim first and room for `rows` rows. A port's row dim is its one
symbolic dim (the node's capture axis: 'windows*104', 'patches/4', 'tokens'); its other dims and dtype make a
row's bytes. The line is rows x the row's bytes over every port read, and the runtime allocates exactly that.

Rows by default: DEFAULT_STEPS x the rows of the node's largest step at its walks' budgets. One step's rows is
the most media (or prompt rows) one prefill step makes; a few of them keep a conversation's earlier turns (or
several conversations) while costing the KV pool a few steps' worth of rows. `--set media_cache.<node>=ROWS`
sets the rows (0: no cache).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from graphc.declare import DTYPE_BYTES, Model, parse_dim
from graphc.errors import InvalidInput
from graphc.strict import closest

DEFAULT_STEPS = 4
SECTION = "media_cache"


@dataclass(frozen=True)
class RowPort:
    port: str
    dim: int                   # the port's row dim
    row_shape: tuple[int, ...]  # the port's other dims, in order
    dtype: str

    @property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape) * DTYPE_BYTES[self.dtype]


def llm_of(model: Model) -> str | None:
    """The pipeline's LLM node; None for a model declared to plan only."""
    return model.pipeline.llm.node if model.pipeline is not None else None


def encoders(model: Model) -> dict[str, list[str]]:
    """Encoder node -> the ports of it the LLM reads, in declaration order."""
    llm, out = llm_of(model), {}
    for e in model.edges:
        (src, port), (dst, _) = e.ends()
        if llm is not None and dst == llm and port not in out.get(src, []):
            out.setdefault(src, []).append(port)
    return out


def follow_read(model: Model) -> str | None:
    """The LLM's output port a follow stage reads; None without one."""
    follow = model.pipeline.follow if model.pipeline is not None else None
    return follow.reads if follow is not None else None


def cached(model: Model) -> dict[str, list[str]]:
    """Node -> the ports of it another stage reads, each cached: the encoders the LLM reads, then the LLM where a
    follow stage reads it (module docstring)."""
    out = encoders(model)
    if (port := follow_read(model)) is not None:
        out[llm_of(model)] = [port]
    return out


def row_ports(model: Model, node: str) -> list[RowPort]:
    """The ports of `node` a cache holds, each with its row dim (module docstring)."""
    out = []
    for port in cached(model)[node]:
        spec = model.node(node).outputs[port]
        dims = [i for i, d in enumerate(spec.shape) if parse_dim(d)[0] is not None]
        if len(dims) != 1:
            raise InvalidInput(f"{node}.{port} has {len(dims)} symbolic dims {spec.shape}; the media cache keeps "
                               "rows along exactly one", "a cached row is the port's slice at one row",
                               f"declare the port with one capture-axis dim, or plan with --set {SECTION}.{node}=0")
        rest = tuple(int(d) for i, d in enumerate(spec.shape) if i != dims[0])
        out.append(RowPort(port, dims[0], rest, spec.dtype))
    return out


def row_bytes(model: Model, node: str) -> int:
    return sum(p.row_bytes for p in row_ports(model, node))


def step_rows(ir, node: str) -> int:
    """Rows of the encoder's largest step at its walks' budgets (its first read port's row dim)."""
    first = row_ports(ir.model, node)[0]
    spec = ir.node(node).outputs[first.port]
    return max(spec.concrete(s.sizes_at(s.budget))[first.dim] for s in ir.steps_of(node))


def settings(model: Model, given) -> dict[str, int]:
    """--set media_cache.<node>=ROWS checked: a mapping of cached nodes (cached()) to whole rows >= 0."""
    if given is None:
        return {}
    valid = sorted(cached(model))
    if not isinstance(given, dict):
        raise InvalidInput(f"overrides.{SECTION} must map nodes to rows", f"got {given!r}",
                           f"e.g. --set {SECTION}.{valid[0] if valid else 'NODE'}=0")
    for node, rows in given.items():
        if node not in valid:
            hint = closest(str(node), valid)
            raise InvalidInput(f"unknown node '{node}' in overrides at {SECTION}",
                               f"a row cache is planned for encoders the LLM reads and an LLM a follow stage reads: "
                               f"{', '.join(valid) or '(none)'}",
                               f"use '{hint}'" if hint else f"remove {SECTION}.{node}")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise InvalidInput(f"{SECTION}.{node}={rows!r} is not a whole number of rows >= 0",
                               f"it counts {node}'s output rows the cache holds (0: no cache)",
                               f"e.g. --set {SECTION}.{node}=0, or a row count such as {DEFAULT_STEPS * 1024}")
    return dict(given)


def planned_rows(ir, node: str, given: dict[str, int]) -> tuple[int, str]:
    """(rows, why) of a node's cache: the --set value, or the default rule."""
    if node in given:
        return given[node], f"--set {SECTION}.{node}={given[node]}"
    step = step_rows(ir, node)
    what = "repeated media" if node != llm_of(ir.model) else "the rows its follow stage reads, of cached pages"
    return DEFAULT_STEPS * step, (f"default: {DEFAULT_STEPS} x the {step:,} rows of {node}'s largest step at its "
                                  f"walks' budgets (a few prefill steps of {what})")
