"""Compile a Triton kernel for sm_90 with no GPU: Triton's front end, its NVIDIA backend and the ptxas its wheel
bundles, as the GPU machine compiles it at the first launch. Catches what Triton's interpreter accepts and its
compiler does not (a kernel exact under the interpreter once failed to compile on the GPU). The GPU machine's
Triton version may differ from this one's."""
from __future__ import annotations

import pytest


def compile_sm90(fn, signature: dict[str, str], constexprs: dict, num_warps: int) -> dict[str, str]:
    """The kernel's assembly ('ptx', 'cubin', ...) compiled for sm_90; signature: each argument's Triton type
    ('*bf16', 'i32', ...), constexprs: each constexpr's value. Skips where this Triton has no NVIDIA backend."""
    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        import triton.backends.nvidia  # noqa: F401
    except ImportError as e:
        pytest.skip(f"this Triton cannot compile for CUDA without a device: {e}")
    sig = dict(signature) | dict.fromkeys(constexprs, "constexpr")
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).asm
