"""Which kernel backends exist for each resource kind on each arch: the one table that the
compiler's backend pass and the runtime both read, so a plan and its boot cannot disagree.

Order is preference: 'auto' takes the first entry. FlashInfer names its backends fa2 (sm_80+),
fa3 (Hopper only), cutlass (Blackwell FMHA), trtllm-gen (sm_100 only) and cudnn; 'torch' is this
project's SDPA path, which runs on the CPU (on a GPU it is a test reference, never planned).
"""
from __future__ import annotations

from graphc.errors import InvalidInput

ARCHS = ("sm_80", "sm_89", "sm_90", "sm_100", "sm_103", "cpu")

TABLE: dict[str, dict[str, tuple[str, ...]]] = {
    "ragged_attention": {
        "sm_80": ("fa2",),
        "sm_89": ("fa2",),
        "sm_90": ("fa3", "fa2", "cudnn"),
        "sm_100": ("cutlass", "fa2", "cudnn"),
        "sm_103": ("cutlass", "fa2", "cudnn"),
        "cpu": ("torch",),
    },
    "paged_kv": {
        "sm_80": ("fa2",),
        "sm_89": ("fa2",),
        "sm_90": ("fa3", "fa2"),
        "sm_100": ("trtllm-gen", "fa2"),
        "sm_103": ("fa2",),
        "cpu": ("torch",),
    },
}

# Backends whose kernels use a float workspace (split-KV partial results); the others need none.
USES_FLOAT_WORKSPACE = {"fa2", "cutlass", "cudnn", "trtllm-gen"}


def available(kind: str, arch: str) -> tuple[str, ...]:
    return TABLE.get(kind, {}).get(arch, ())


def choose(kind: str, arch: str, requested: str, resource: str, target: str) -> str:
    """The backend for one resource: the requested one if the arch has it, else a clear refusal."""
    options = available(kind, arch)
    if not options:
        raise InvalidInput(f"resource '{resource}' ({kind}) has no backend on {target} ({arch})",
                           "the capability table lists none for this arch",
                           "plan for another --gpu, or add kernels for this arch to resources/capabilities.py")
    if requested == "auto":
        return options[0]
    if requested not in options:
        everywhere = sorted({b for per in TABLE.get(kind, {}).values() for b in per})
        why = (f"'{requested}' has no kernels for {arch}; {target} has: {', '.join(options)}"
               if requested in everywhere else
               f"'{requested}' is not a {kind} backend; known backends: {', '.join(everywhere)}")
        raise InvalidInput(f"resource '{resource}': backend '{requested}' is not available on {target}",
                           why, f"--set resources.{resource}.backend={options[0]} (or 'auto')")
    return requested
