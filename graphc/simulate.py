"""Run a node's forward on fake (meta-device) tensors and record every storage it allocates and frees.

No kernel runs and no memory is touched: modules are built on the meta device, and resources are
bound to their fake paths. The trace of (alloc | free, key, bytes) events, in the order CPython's
refcounting frees them, is what the allocator model replays.

Meta tensors rather than FakeTensorMode: the same shape inference without the wrapper, and an
op-level cache of it (an op's output metadata is a pure function of its inputs' metadata), which
makes the 48 identical layers of a real model cost about one.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from graphc.declare import TORCH_DTYPES, Node, Port
from graphc.errors import InvalidInput
from graphc.modules import build_module
from graphc.step import StepContext

_META_CACHE: dict[tuple, tuple[bool, list[tuple]]] = {}


@dataclass(frozen=True)
class Trace:
    events: tuple[tuple[int, int, int], ...]   # (1 alloc | 0 free, key, nbytes)
    peak_bytes: int                            # peak of live raw bytes during the step
    output_bytes: int                          # bytes of the returned outputs
    retained_bytes: int                        # bytes still alive after the outputs are dropped
    num_ops: int
    launches: int = 0                          # ops that write memory (not pure views): kernels a graph holds
    convs: tuple[tuple[int, str], ...] = ()    # (events before it, signature) of each convolution


def _meta(a):
    if isinstance(a, torch.Tensor):
        return (tuple(a.shape), a.stride(), a.dtype)
    if isinstance(a, (list, tuple)):
        return tuple(_meta(x) for x in a)
    return a


def _fresh(func) -> bool:
    """An op whose every output is a new tensor (no view, no in-place write)."""
    schema = func._schema
    return not schema.is_mutable and all(r.alias_info is None for r in schema.returns)


def conv_signature(x, w, bias, stride, padding, dilation, transposed, output_padding, groups) -> str:
    """What cuDNN chooses a convolution engine (and its workspace) by: shapes, dtype and geometry."""
    def ints(v):
        return ",".join(str(int(i)) for i in v)
    return (f"{'convT' if transposed else 'conv'} x[{ints(x.shape)}] w[{ints(w.shape)}] {str(x.dtype)[6:]}"
            f"{' bias' if bias is not None else ''} s{ints(stride)} p{ints(padding)} d{ints(dilation)}"
            f" op{ints(output_padding)} g{int(groups)}")


def _view(func) -> bool:
    """An op that only aliases its input (view, reshape, slice): no kernel runs."""
    schema = func._schema
    return not schema.is_mutable and bool(schema.returns) and all(r.alias_info is not None for r in schema.returns)


class _Recorder(TorchDispatchMode):
    """Sees every aten op; a storage it has not seen is an allocation, its death a free."""

    def __init__(self, known: set[int]):
        super().__init__()
        self.known = known            # storages that existed before the step (weights, static inputs)
        self.refs: dict[int, weakref.ref] = {}
        self.events: list[tuple[int, int, int]] = []
        self.live = 0
        self.peak = 0
        self.ops = 0
        self.launches = 0
        self.convs: list[tuple[int, str]] = []
        self._next = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        self.launches += not _view(func)
        out = self._cached(func, args, kwargs) if _fresh(func) else func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._see(t.untyped_storage())
        if func is torch.ops.aten.convolution.default:
            # its library workspace is taken after the output and freed when it returns
            self.convs.append((len(self.events), conv_signature(*args)))
        return out

    def _cached(self, func, args, kwargs):
        try:
            key = (func, _meta(args), tuple(sorted((k, _meta(v)) for k, v in kwargs.items())))
            hit = _META_CACHE.get(key)
        except TypeError:            # an unhashable argument: just run the meta kernel
            return func(*args, **kwargs)
        if hit is not None:
            single, specs = hit
            outs = [torch.empty_strided(s, st, dtype=d, device="meta") for s, st, d in specs]
            return outs[0] if single else tuple(outs)
        out = func(*args, **kwargs)
        leaves = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else None
        if leaves and all(isinstance(t, torch.Tensor) for t in leaves):
            _META_CACHE[key] = (isinstance(out, torch.Tensor), [_meta(t) for t in leaves])
        return out

    def _see(self, storage) -> None:
        sid = id(storage)
        if sid in self.known or sid in self.refs:
            return
        n = storage.nbytes()
        key = self._next
        self._next += 1
        self.events.append((1, key, n))
        self.live += n
        self.peak = max(self.peak, self.live)

        def died(_ref, sid=sid, key=key, n=n):
            self.refs.pop(sid, None)
            self.live -= n
            self.events.append((0, key, n))

        self.refs[sid] = weakref.ref(storage, died)


class FakeNode:
    """A node's module on meta tensors, ready to trace steps."""

    def __init__(self, node: Node):
        self.node = node
        self.module = build_module(node, "meta")
        self.known = {id(t.untyped_storage()) for t in list(self.module.parameters()) + list(self.module.buffers())}

    @staticmethod
    def inputs(ports: dict[str, Port], sizes: dict[str, int]) -> dict[str, torch.Tensor]:
        return {name: torch.empty(port.concrete(sizes), dtype=TORCH_DTYPES[port.dtype], device="meta")
                for name, port in ports.items()}

    def trace(self, ports: dict[str, Port], sizes: dict[str, int], bindings: dict, where: str) -> Trace:
        inputs = self.inputs(ports, sizes)
        rec = _Recorder(self.known | {id(t.untyped_storage()) for t in inputs.values()})
        try:
            with rec, torch.no_grad():
                out = self.module(StepContext(bindings), **inputs)
                self._check_outputs(out, sizes, where)
                out_bytes = sum(t.untyped_storage().nbytes() for t in out.values())
                del out
        except InvalidInput:
            raise
        except Exception as e:
            raise InvalidInput(f"{where}: the forward fails on fake tensors: {type(e).__name__}: {e}",
                               "a step the compiler cannot trace without data cannot be captured either "
                               "(data-dependent shapes, host syncs, device-specific code)",
                               "keep shapes static and the forward free of .item()/.tolist() and device checks") from e
        del inputs
        return Trace(tuple(rec.events), rec.peak, out_bytes, rec.live, rec.ops, rec.launches, tuple(rec.convs))

    def _check_outputs(self, out: dict, sizes: dict[str, int], where: str) -> None:
        declared = self.node.outputs
        if not isinstance(out, dict) or set(out) != set(declared):
            got = sorted(out) if isinstance(out, dict) else type(out).__name__
            raise InvalidInput(f"{where}: forward returned {got}, the node declares outputs {sorted(declared)}",
                               "a node's forward returns a dict of exactly its declared outputs",
                               "make the declaration and the module agree")
        for name, port in declared.items():
            want, t = port.concrete(sizes), out[name]
            if tuple(t.shape) != want or t.dtype != TORCH_DTYPES[port.dtype]:
                raise InvalidInput(f"{where}: output '{name}' is {list(t.shape)} {str(t.dtype).removeprefix('torch.')}",
                                   f"the node declares {list(port.shape)} {port.dtype}, i.e. {list(want)} here",
                                   "fix the port declaration or the module")
