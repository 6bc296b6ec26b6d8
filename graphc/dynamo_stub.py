"""A planning process without torch._dynamo (issue 14: a cold `graphc plan` in seconds).

torch's meta kernels written in Python (the elementwise references behind most ops on meta tensors) and every
TorchDispatchMode's __torch_dispatch__ are wrapped by torch._disable_dynamo, which on its first call imports
torch._dynamo (1.2-1.6 s on the 2-core machine, a quarter of a cold plan) only to exclude the function from
torch.compile's tracing, and keeps the wrapped function on it. A plan compiles nothing, so while it is made,
`import torch._dynamo` gives a stand-in whose disable(fn) is fn: what torch.compile would skip is run as it is.
Anything else asked of the stand-in imports the real torch._dynamo in its place and answers from it.

The functions first called inside stay unwrapped for the rest of the process: a process that plans and then
compiles with torch.compile could trace into them. graphc compiles nothing; `graphc plan` uses this, the
library's compile_model does not.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
import types

NAME = "torch._dynamo"


class _Stub(types.ModuleType):
    """torch._dynamo's disable, as a process that never compiles needs it."""

    @staticmethod
    def disable(fn=None, recursive=True, wrapping=True):    # noqa: ARG004 (torch._dynamo.disable's signature)
        return fn if fn is not None else (lambda f: f)

    def __getattr__(self, name: str):
        if name.startswith("__"):         # a module's dunders, which importlib and inspect probe on every module
            raise AttributeError(name)
        return getattr(_real(), name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == NAME else None

    def create_module(self, spec):
        return _Stub(spec.name)

    def exec_module(self, module) -> None:
        pass


_FINDER = _Finder()


def _real() -> types.ModuleType:
    """The real torch._dynamo, in place of the stand-in."""
    _remove()
    return importlib.import_module(NAME)


def _remove() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    if isinstance(sys.modules.get(NAME), _Stub):
        del sys.modules[NAME]
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(vars(torch).get("_dynamo"), _Stub):
            delattr(torch, "_dynamo")


@contextlib.contextmanager
def without_dynamo():
    """While inside, torch._dynamo is the stand-in unless the real one is imported already. Imports nothing."""
    if NAME in sys.modules:
        yield
        return
    sys.meta_path.insert(0, _FINDER)
    try:
        yield
    finally:
        _remove()
