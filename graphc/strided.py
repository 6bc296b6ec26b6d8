"""The bytes of a strided tensor's storage, as torch allocates it: what the simulation's op memo (simulate.py)
and its layer memo (layer_memo.py) check that an output owns, exactly and from offset 0, before they rebuild
it from its metadata alone."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def storage_bytes(t: torch.Tensor) -> int:
    """The bytes torch.empty_strided gives a tensor of this shape and stride."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))) * t.element_size()
