"""Compile Triton kernels for sm_90 with no GPU: Triton's front end, its NVIDIA backend and the ptxas its wheel
bundles, as the GPU machine compiles them at their first launch. Catches what Triton's interpreter accepts and
its compiler does not (Python the interpreter runs, shapes and types the compiler refuses). The GPU machine's
Triton version may differ from this one's.

compile_sm90 compiles one kernel for a given signature. RECORDER, run before an interpreted script (tests/unit/
test_moe_triton.interpreted does), writes each distinct launch the script makes (the kernel, its arguments'
Triton types, its constexprs, its warps) to the JSON file named by GRAPHC_SM90_LAUNCHES; `python
tests/sm90_compile.py FILE` then compiles each of them, and each one with a PDL constexpr with it on too."""
from __future__ import annotations

import importlib
import json
import sys

RECORDER = r'''
import atexit as _atexit, json as _json, os as _os
import torch as _torch
from triton.runtime import interpreter as _interp

_TYPES = {_torch.float32: "fp32", _torch.float16: "fp16", _torch.bfloat16: "bf16", _torch.float64: "fp64",
          _torch.int64: "i64", _torch.int32: "i32", _torch.int16: "i16", _torch.int8: "i8", _torch.uint8: "u8",
          _torch.bool: "i1"}
_seen = {}


def _ty(v):
    if isinstance(v, _torch.Tensor):
        return "*" + _TYPES[v.dtype]
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i32" if -2**31 <= v < 2**31 else "i64"
    if isinstance(v, float):
        return "fp32"
    raise TypeError(type(v).__name__)


def _record(ex, args, kwargs):
    import inspect
    if ex.fn.__module__ == "__main__":
        return                                          # a probe the script defines for itself
    bound = inspect.getcallargs(ex.fn, *args, **{k: v for k, v in kwargs.items() if k in ex.arg_names})
    sig, consts = {}, {}
    for name in ex.arg_names:
        v = bound[name]
        if name in ex.constexprs or v is None:
            consts[name] = v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)
        else:
            try:
                sig[name] = _ty(v)
            except (TypeError, KeyError):
                return                                  # an argument this recorder cannot type: left out
    key = _json.dumps([ex.fn.__module__, ex.fn.__name__, sig, consts, kwargs.get("num_warps", 4)], sort_keys=True)
    _seen[key] = True


_call = _interp.GridExecutor.__call__


def _recording(self, *args, **kwargs):
    _record(self, args, kwargs)
    return _call(self, *args, **kwargs)


_interp.GridExecutor.__call__ = _recording
_atexit.register(lambda: open(_os.environ["GRAPHC_SM90_LAUNCHES"], "w").write(_json.dumps([_json.loads(k) for k in _seen])))
'''


def compile_sm90(fn, signature: dict[str, str], constexprs: dict, num_warps: int) -> dict[str, str]:
    """The kernel's assembly ('ptx', 'cubin', ...) compiled for sm_90; signature: each argument's Triton type
    ('*bf16', 'i32', ...), constexprs: each constexpr's value. Raises ImportError where this Triton has no
    NVIDIA backend."""
    import triton
    import triton.backends.nvidia  # noqa: F401
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = dict(signature) | dict.fromkeys(constexprs, "constexpr")
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).asm


def compile_launches(path: str) -> list[str]:
    """Compile every launch RECORDER wrote to path (and, where the kernel has a PDL constexpr, with it on);
    the kernels compiled, as module.name."""
    done = []
    for module, name, sig, consts, warps in json.load(open(path)):
        fn = getattr(importlib.import_module(module), name)
        for variant in [consts] + ([consts | {"PDL": True}] if consts.get("PDL") is False else []):
            compile_sm90(fn, sig, variant, warps)
        done.append(f"{module}.{name}")
    return done


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[2] if len(sys.argv) > 2 else ".")
    print(json.dumps(sorted(set(compile_launches(sys.argv[1])))))
