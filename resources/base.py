"""What every resource kind provides: a strict spec, size formulas per backend, and a fake path."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field

from graphc.strict import Strict


@dataclass(frozen=True)
class StepShape:
    """What one step at one rung asks of a resource.

    rows: query rows in the step; seqs: sequences or segments; kv_len: the longest key span one row
    attends to; phase: 'prefill' (many rows per sequence) or 'decode' (one row per sequence).
    """

    rows: int
    seqs: int
    kv_len: int
    phase: str = "prefill"


@dataclass(frozen=True)
class Sized:
    """A byte count with the arithmetic that produced it, for `graphc explain`."""

    bytes: int
    formula: str


class ResourceSpec(Strict):
    """Base of RaggedAttentionSpec, PagedKVSpec, WorkspaceSpec, ..."""

    kind: ClassVar[str] = "resource"
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @property
    def is_attention(self) -> bool:
        return False

    def fake(self, shape: StepShape, run_head_dim: int | None = None) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError(f"{type(self).__name__} has no fake path")
