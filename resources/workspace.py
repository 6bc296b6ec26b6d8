"""A workspace: float scratch that attention backends share (split-KV partials), in slots."""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from resources.base import ResourceSpec


class WorkspaceSpec(ResourceSpec):
    """Declared scratch: `bytes` per slot (None: the compiler sizes it to its users' largest need);
    two slots let one step plan while the last one runs."""

    kind: ClassVar[str] = "workspace"
    bytes: int | None = Field(None, ge=0)
    slots: int = Field(1, ge=1)
