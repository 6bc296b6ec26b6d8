"""What a node's forward receives besides its tensors: the resources bound for this step."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch

# a port's or node's declared dtype (graphc.declare.DType) as torch's
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "int64": torch.int64, "int32": torch.int32, "bool": torch.bool, "uint8": torch.uint8}


class StepContext:
    """Role name -> the resource bound for this step (a backend with its step metadata, or a fake)."""

    def __init__(self, bindings: dict[str, Any], reduce: Callable[[torch.Tensor], torch.Tensor] | None = None):
        """reduce: sums a tensor over the node's tensor-parallel ranks (None: the node runs whole on one rank)."""
        self._bindings = dict(bindings)
        self._reduce = reduce

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the tensor-parallel ranks that run this node, each holding a part of its heads and
        MLP (a row-parallel projection's partial output); x itself when the node is not split. Every rank
        calls it at the same point of the same step."""
        return x if self._reduce is None else self._reduce(x)

    def __getitem__(self, role: str) -> Any:
        try:
            return self._bindings[role]
        except KeyError:
            raise KeyError(f"no resource bound for role '{role}'; bound: {sorted(self._bindings)}") from None


@dataclass(frozen=True)
class Split:
    """How a tensor-parallel rank's part of one disk tensor is cut from it (a disk tensor no Split matches is
    replicated: every rank loads it whole).

    pattern: a regex fullmatched against the disk tensor's name relative to the node's weight_prefix (the
    checkpoint's names: ...q_proj.weight, ...experts.3.down_proj.weight, ...experts.gate_up_proj).
    dim: the axis cut into tp equal parts, rank r taking part r.
    blocks: the full lengths of parts laid end to end along dim (in_proj_qkv's (key_dim, key_dim, value_dim),
    fused experts' gate_up (I, I)); each is cut in tp parts and rank r takes part r of each, in order. Empty:
    the axis is one block.
    """

    pattern: str
    dim: int
    blocks: tuple[int, ...] = ()

    def __post_init__(self):
        if not isinstance(self.pattern, str):
            raise TypeError(f"Split.pattern must be a str (a regex), not {type(self.pattern).__name__}")
        re.compile(self.pattern)                          # a bad regex fails here, with re's message
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 0:
            raise ValueError(f"Split({self.pattern!r}).dim is {self.dim!r}: an axis index, 0 or more")
        if not isinstance(self.blocks, tuple) or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                                     for b in self.blocks):
            raise ValueError(f"Split({self.pattern!r}).blocks is {self.blocks!r}: a tuple of lengths, each 1 or "
                             "more (empty: the whole axis is one block)")

    def matches(self, name: str) -> bool:
        return re.fullmatch(self.pattern, name) is not None


class NodeModule(torch.nn.Module):
    """Base of every node's module.

    ROLES names the resources the module calls and their kind, e.g. {"attn": "ragged_attention"};
    a Node binds each role to a declared resource. forward(ctx, **inputs) returns a dict of the
    node's declared outputs.
    """

    ROLES: ClassVar[dict[str, str]] = {}

    def tp_splits(self) -> list[Split]:
        """How this module's disk tensors are cut over tensor-parallel ranks (graphc/runtime/checkpoint.py reads
        a rank's parts by them); none by default: a module that is not split loads every tensor whole."""
        return []
