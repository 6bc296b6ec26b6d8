"""Programmatic dependent launch (PDL, sm_90 and later) for graphc's Triton kernels: the plan's pdl knob.

A kernel launched with PDL may start while the kernel before it in the stream still runs, once every program of
that one has signalled (_pdl_start, at its top) or ended. So that nothing is read early, a PDL kernel reads only
constants (weights) before _pdl_wait, which returns when the kernel before it has finished and its writes are
visible; it writes nothing before it. Each PDL kernel waits so before it ends, so the kernel after it finds every
earlier kernel done too. In a CUDA graph the launch becomes a programmatic edge. Under Triton's interpreter (CPU
tensors) no launch asks for it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _pdl_start(PDL: tl.constexpr):
    """With PDL (the kernel launched with programmatic dependent launch, the plan's pdl knob): let the stream's
    next kernel launch now, so that it loads its weights while this one runs (it waits for this one's end before
    reading anything this one writes: _pdl_wait)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _pdl_wait(PDL: tl.constexpr):
    """With PDL: wait until the kernel before this one in the stream has finished and its writes are visible.
    A PDL kernel reads only constants (weights) before it and writes nothing before it."""
    if PDL:
        tl.extra.cuda.gdc_wait()


def pdl_launch(pdl: bool, x: torch.Tensor) -> dict:
    """The launch arguments of a kernel (with a PDL constexpr) whose tensors lie with x: programmatic dependent
    launch where the plan asks for it (pdl) and x is on a GPU (Triton's interpreter, on CPU tensors, has no grid
    dependency control), else none."""
    return {"PDL": True, "launch_pdl": True} if pdl and x.device.type == "cuda" else {}
