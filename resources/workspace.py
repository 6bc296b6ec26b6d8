"""A workspace: float scratch that attention backends share (split-KV partials), in slots."""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from resources.base import ResourceSpec


class WorkspaceSpec(ResourceSpec):
    """Declared scratch: `bytes` per slot; two slots let one step plan while the last one runs."""

    kind: ClassVar[str] = "workspace"
    bytes: int = Field(ge=0)
    slots: int = Field(1, ge=1)

    @property
    def total_bytes(self) -> int:
        return self.bytes * self.slots
