"""What a node's forward receives besides its tensors: the resources bound for this step."""
from __future__ import annotations

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


class NodeModule(torch.nn.Module):
    """Base of every node's module.

    ROLES names the resources the module calls and their kind, e.g. {"attn": "ragged_attention"};
    a Node binds each role to a declared resource. forward(ctx, **inputs) returns a dict of the
    node's declared outputs.
    """

    ROLES: ClassVar[dict[str, str]] = {}
