"""Resource kinds: one file each with its spec, its size formulas, its backends and a fake path."""
from resources.base import ResourceSpec, Sized, StepShape
from resources.linear_state import LinearStateSpec
from resources.paged_kv import PagedKVSpec
from resources.ragged_attention import RaggedAttentionSpec
from resources.workspace import WorkspaceSpec

__all__ = ["ResourceSpec", "Sized", "StepShape", "LinearStateSpec", "PagedKVSpec", "RaggedAttentionSpec", "WorkspaceSpec"]
