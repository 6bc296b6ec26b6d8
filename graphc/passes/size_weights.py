"""Exact weight bytes per node, from its module built on the meta device."""
from __future__ import annotations

from dataclasses import dataclass

from graphc import memo
from graphc.ir import IR
from graphc.modules import WeightSizes, meta_module, node_key, weight_sizes


@dataclass(frozen=True)
class Weights:
    per_node: dict[str, WeightSizes]

    def check(self, ir: IR) -> None:
        assert set(self.per_node) == {n.name for n in ir.model.nodes}


_CACHE: dict[tuple, WeightSizes] = memo.table("size_weights")


def _sizes(node) -> WeightSizes:
    key = node_key(node)
    if key not in _CACHE:
        _CACHE[key] = weight_sizes(meta_module(node))
    return _CACHE[key]


def size_weights(ir: IR) -> Weights:
    out = Weights({n.name: _sizes(n) for n in ir.model.nodes})
    out.check(ir)
    return out
