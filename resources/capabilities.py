"""Which kernel backends exist for each resource kind on each arch: the one table that the
compiler's backend pass and the runtime both read, so a plan and its boot cannot disagree.

Order is preference: 'auto' takes the first entry. FlashInfer names its backends fa2 (sm_80+),
fa3 (Hopper only), cutlass (Blackwell FMHA), trtllm-gen (sm_100 only) and cudnn; 'torch' is this
project's SDPA path, which runs on the CPU (on a GPU it is a test reference, never planned); 'triton' is
this project's short-segment kernel (resources/ragged_triton.py), which takes only some resources (SHORT_SEGMENT),
and for paged decode its one-launch append + decode kernel (resources/paged_triton.py).
"""
from __future__ import annotations

from graphc.errors import InvalidInput

ARCHS = ("sm_80", "sm_89", "sm_90", "sm_100", "sm_103", "cpu")

TABLE: dict[str, dict[str, tuple[str, ...]]] = {
    "ragged_attention": {
        "sm_80": ("fa2",),
        "sm_89": ("fa2",),
        "sm_90": ("triton", "fa3", "fa2", "cudnn"),     # triton only where it fits: see SHORT_SEGMENT
        "sm_100": ("cutlass", "fa2", "cudnn"),
        "sm_103": ("cutlass", "fa2", "cudnn"),
        "cpu": ("torch",),
    },
    "paged_kv": {            # prefill and mixed steps
        "sm_80": ("fa2",),
        "sm_89": ("fa2",),
        "sm_90": ("fa3", "fa2"),
        "sm_100": ("trtllm-gen", "fa2"),
        "sm_103": ("fa2",),
        "cpu": ("torch",),
    },
    # the gated delta rule of linear-attention layers (resources/linear_state.py): 'fla' is flash-linear-attention's
    # Triton kernels (fla-core; the chunked rule for prompt rows, the fused recurrent one for decode), run and
    # checked on sm_90 only (tests/gpu/test_gated_deltanet_gpu.py); 'torch' is models/components/delta_rule.py
    # (decode captures on a GPU too; prompt rows run eagerly on either). The causal conv runs in torch on both.
    "linear_state": {
        "sm_80": ("torch",),
        "sm_89": ("torch",),
        "sm_90": ("fla", "torch"),
        "sm_100": ("torch",),
        "sm_103": ("torch",),
        "cpu": ("torch",),
    },
    # steps of one row per sequence. 'triton' is this project's one-launch append + decode (resources/paged_triton.py):
    # on an H100 faster than fa2 at 1 to 64 sequences of 256 and 2,048 keys; fa2 against fa3: 80 us vs 522 on the
    # H200 (docs/gpu-attention.md)
    "paged_kv_decode": {
        "sm_80": ("fa2",),
        "sm_89": ("fa2",),
        "sm_90": ("triton", "fa2", "fa3"),
        "sm_100": ("trtllm-gen", "fa2"),
        "sm_103": ("fa2",),
        "cpu": ("torch",),
    },
}

# Head dims a backend's kernels take; another runs padded with zeros up to the next one it takes
# (same scores with the real head dim's scale; the padded output columns are dropped).
# fa3: FlashInfer's Hopper kernels are instantiated for 64, 128 and 256 only. fa2 on the H200:
# 72 gave wrong results, 80 an illegal memory access, and the paged append kernel refuses 16
# (docs/gpu-attention.md); 64, 128 and 256 are the dims it was seen to run.
HEAD_DIMS = {"fa3": (64, 128, 256), "fa2": (64, 128, 256)}

# Decode runs on FlashInfer's tensor-core (prefill) kernels once a kv head serves at least this many
# query heads, as vLLM and SGLang do (group > 4); below it the CUDA-core decode kernel is faster.
TENSOR_CORE_MIN_GROUP = 5


def tensor_core_decode(decode_backend: str, num_qo_heads: int, num_kv_heads: int) -> bool:
    """fa3 decodes only on tensor cores; fa2 does once the GQA group is large enough."""
    return decode_backend == "fa3" or num_qo_heads // num_kv_heads >= TENSOR_CORE_MIN_GROUP


def phases(spec, backend: str, decode_backend: str | None) -> list[tuple[str, str]]:
    """(phase, backend) of each kind of kernel call an attention resource makes."""
    if spec.kind == "ragged_attention":
        return [("ragged", backend)]
    return [("prefill", backend), ("decode", decode_backend or backend)]


def flashinfer_modules(spec, phase: str, backend: str, run_head_dim: int | None = None) -> tuple[str, ...]:
    """The FlashInfer JIT modules one phase ('ragged', 'prefill' or 'decode') of a resource loads.

    One prefill module per (backend, head dim, window, kv dtype) serves ragged and paged prefill and
    tensor-core decode (the mask is a run-time argument); fa2's paged runs load a second module;
    CUDA-core decode has its own; paged steps append through the page module."""
    head_dim = run_head_dim or spec.head_dim
    if backend == "triton":
        return ()
    if spec.kind == "ragged_attention":
        return (f"prefill:{backend}:{head_dim}{':swa' if spec.window is not None else ''}",)
    dtype = "" if spec.dtype == "bfloat16" else f":{spec.dtype}"
    if phase == "decode" and not tensor_core_decode(backend, spec.num_qo_heads, spec.num_kv_heads):
        return ("page", f"decode:{backend}:{head_dim}{dtype}")
    return ("page", f"prefill:{backend}:{head_dim}{dtype}") + ((f"paged:{backend}:{head_dim}{dtype}",)
                                                               if backend == "fa2" else ())


def run_head_dim(backend: str, head_dim: int) -> int | None:
    """The head dim the backend's kernels run a head_dim at (itself, or padded), or None."""
    dims = HEAD_DIMS.get(backend)
    if dims is None:
        return head_dim
    return next((d for d in dims if d >= head_dim), None)

# 'triton' holds a whole segment in one program (resources/ragged_triton.py): it takes a resource whose
# segments all have one length (rows_per_segment) of at most SHORT_SEGMENT rows, a power-of-two GQA group and
# a head dim of at most 256; 'auto' passes over it for any other, and asking for it there is refused. First in
# sm_90's order: on the H200 the code predictor's 16-row frames took 3.4 us a call against fa3's 6.3 at one
# frame and 4.6 against 16.4 at 32 (examples/bench/bench_talker_kernels.py), and a talker decode step 4.07 ms
# against 4.31 at one sequence, 6.89 against 7.75 at 32 (docs/benchmarks.md); tests/gpu/test_ragged_triton_gpu.py
# holds its error at most fa3's.
SHORT_SEGMENT = 32


def unfit(spec, backend: str) -> str | None:
    """Why a backend cannot run this resource at all (None: it can; head dims aside, see run_head_dim)."""
    if backend != "triton":
        return None
    if spec is None:
        return "it takes only some resources, and none was given"
    if spec.kind == "paged_kv":      # the decode kernel (resources/paged_triton.py) holds a head in one block
        d = spec.head_dim            # run on a GPU at 128 only; at 256 its key and value tiles take 64 KiB a stage
        return None if 16 <= d <= 128 and not d & (d - 1) else f"head_dim {d}: it takes powers of two from 16 to 128"
    why = []
    if spec.rows_per_segment is None:
        why.append("its segments have no fixed length (rows_per_segment)")
    if spec.max_segment > SHORT_SEGMENT:
        why.append(f"max_segment {spec.max_segment} > {SHORT_SEGMENT}")
    group = spec.num_heads // spec.kv_heads
    if group & (group - 1):
        why.append(f"its GQA group of {group} heads is not a power of two")
    if spec.head_dim > 256:
        why.append(f"head_dim {spec.head_dim} > 256")
    return "; ".join(why) or None


# Backends whose kernels use a float workspace (split-KV partial results); the others need none.
USES_FLOAT_WORKSPACE = {"fa2", "cutlass", "cudnn", "trtllm-gen"}

# Backends the table lists but a plan may not take: what the ledger would say of them is neither a formula
# nor a measurement (issue 14). 'auto' passes over them; asking for one is refused with the reason.
UNPLANNED = {
    "cudnn": "its float workspace is cuDNN's own, neither modelled nor measured here (FA2's formula would "
             "stand in, and the ledger would not be exact); its frontend package is not in the GPU image",
}


def available(kind: str, arch: str) -> tuple[str, ...]:
    return TABLE.get(kind, {}).get(arch, ())


def choose(kind: str, arch: str, requested: str, resource: str, target: str, head_dim: int | None = None,
           field: str = "backend", pad: bool = True, spec=None) -> tuple[str, int | None]:
    """(backend, the head dim its kernels run at) for one resource (pad=False: a KV cache stores the
    real head dim, so only backends that take it as it is qualify; spec: the resource, for backends that
    take only some, see unfit): the requested backend if the arch has it and it fits, else a clear
    refusal; 'auto' takes the first in preference order that can run it at head_dim (padded if it must:
    measured backends first, so unmeasured ones never win by default)."""
    options = available(kind, arch)
    if not options:
        raise InvalidInput(f"resource '{resource}' ({kind}) has no backend on {target} ({arch})",
                           "the capability table lists none for this arch",
                           "plan for another --gpu, or add kernels for this arch to resources/capabilities.py")
    if requested in UNPLANNED and requested in options:
        planned = [b for b in options if b not in UNPLANNED]
        raise InvalidInput(f"resource '{resource}': backend '{requested}' is not planned", UNPLANNED[requested],
                           f"--set resources.{resource}.{field}=auto (on {target}: {', '.join(planned)})")
    options = tuple(b for b in options if b not in UNPLANNED)
    fits = tuple(b for b in options if not unfit(spec, b))
    if requested in options and requested not in fits:
        raise InvalidInput(f"resource '{resource}': backend '{requested}' cannot run it", unfit(spec, requested),
                           f"--set resources.{resource}.{field}=auto (on {target}: {', '.join(fits)})")
    options = fits
    if requested == "auto":
        if head_dim is None:
            return options[0], None
        runnable = [b for b in options if run_head_dim(b, head_dim) == head_dim
                    or (pad and run_head_dim(b, head_dim) is not None)]
        if not runnable:
            raise InvalidInput(f"resource '{resource}': no {kind} backend on {target} ({arch}) takes head_dim {head_dim}",
                               f"backends there: {', '.join(options)}", "plan for another --gpu")
        return runnable[0], run_head_dim(runnable[0], head_dim)
    if requested not in options:
        everywhere = sorted({b for per in TABLE.get(kind, {}).values() for b in per})
        why = (f"'{requested}' has no kernels for {arch}; {target} has: {', '.join(options)}"
               if requested in everywhere else
               f"'{requested}' is not a {kind} backend; known backends: {', '.join(everywhere)}")
        raise InvalidInput(f"resource '{resource}': backend '{requested}' is not available on {target}",
                           why, f"--set resources.{resource}.{field}={options[0]} (or 'auto')")
    runs = run_head_dim(requested, head_dim) if head_dim is not None else None
    if head_dim is not None and (runs is None or (not pad and runs != head_dim)):
        raise InvalidInput(f"resource '{resource}': backend '{requested}' has no kernels for head_dim {head_dim}",
                           f"it takes {HEAD_DIMS[requested]}", f"--set resources.{resource}.{field}=auto")
    return requested, runs
