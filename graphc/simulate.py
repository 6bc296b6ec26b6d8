"""Run a node's forward on fake (meta-device) tensors and record every storage it allocates and frees.

No kernel runs and no memory is touched: modules are built on the meta device, and resources are
bound to their fake paths. The trace of (alloc | free, key, bytes) events, in the order CPython's
refcounting frees them, is what the allocator model replays.

Meta tensors rather than FakeTensorMode: the same shape inference without the wrapper, and an
op-level memo of it (an op's output metadata is a pure function of its inputs' metadata), which
makes the 48 identical layers of a real model cost about one. The memo only holds ops whose every
output is a new, exactly sized storage; an op that aliases an input although its schema says it
does not (aten._unsafe_view, under every reshape of a non-contiguous tensor) always runs.

A trace is a pure function of the node, its inputs and its bindings: storages are told apart by
identity while they live (known ones are held, so no id is reused during a step), the cyclic
garbage collector is off during a step (frees happen in refcount order; what only a reference
cycle holds dies at the step's end), and a forward that leaves storages alive past its step is
refused (a later step would not see them again).
"""
from __future__ import annotations

import gc
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from graphc import memo
from graphc.declare import Node, Port
from graphc.errors import InvalidInput
from graphc.layer_memo import Memo
from graphc.modules import meta_module
from graphc.step import TORCH_DTYPES, StepContext
from graphc.strided import storage_bytes
from graphc.trace import Trace

# (op, input metadata) -> (output container, [(shape, stride, dtype)]), or None: always run the op
_META_CACHE: dict[tuple, tuple[type, list[tuple]] | None] = memo.table("simulate.meta")


def _meta(a):
    if isinstance(a, torch.Tensor):
        return (tuple(a.shape), a.stride(), a.storage_offset(), a.dtype)
    if isinstance(a, (list, tuple)):
        return tuple(_meta(x) for x in a)
    return a


def _layouts(out, inputs: set[int]) -> tuple[type, list[tuple]] | None:
    """How to rebuild an op's outputs from metadata alone, or None when that would differ from
    running it: an output that is not a tensor, aliases an input or another output, or does not
    own exactly an empty_strided-sized storage from offset 0."""
    leaves = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else None
    if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
        return None
    storages = {id(t.untyped_storage()) for t in leaves}
    if len(storages) != len(leaves) or storages & inputs:
        return None
    if any(t.storage_offset() or t.untyped_storage().nbytes() != storage_bytes(t) for t in leaves):
        return None
    return type(out), [(tuple(t.shape), t.stride(), t.dtype) for t in leaves]


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

    def __init__(self, known: list[torch.Tensor]):
        super().__init__()
        # storages that existed before the step (weights, static inputs), held so that no new
        # storage can take one of their ids while the step runs
        self.known = {id(s): s for s in (t.untyped_storage() for t in known)}
        self.refs: dict[int, weakref.ref] = {}
        self.keys: dict[int, int] = {}           # storage id -> its key in the events, while it lives
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
            hit = _META_CACHE.get(key, False)
        except TypeError:            # an unhashable argument: just run the meta kernel
            return func(*args, **kwargs)
        if hit:
            container, specs = hit
            outs = [torch.empty_strided(s, st, dtype=d, device="meta") for s, st, d in specs]
            return outs[0] if container is torch.Tensor else container(outs)
        out = func(*args, **kwargs)
        if hit is False:
            inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            _META_CACHE[key] = _layouts(out, inputs)
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
        self.track(storage, key)

    def track(self, storage, key: int) -> None:
        """Record the storage's death as the free of `key` (its allocation is already in the events)."""
        sid, n = id(storage), storage.nbytes()

        def died(_ref, sid=sid, key=key, n=n):
            self.refs.pop(sid, None)
            self.keys.pop(sid, None)
            self.live -= n
            self.events.append((0, key, n))

        self.refs[sid] = weakref.ref(storage, died)
        self.keys[sid] = key


class FakeNode:
    """A node's module on meta tensors, ready to trace steps."""

    def __init__(self, node: Node):
        self.node = node
        self.module = meta_module(node)
        self.known = list(self.module.parameters()) + list(self.module.buffers())

    @staticmethod
    def inputs(ports: dict[str, Port], sizes: dict[str, int]) -> dict[str, torch.Tensor]:
        return {name: torch.empty(port.concrete(sizes), dtype=TORCH_DTYPES[port.dtype], device="meta")
                for name, port in ports.items()}

    def trace(self, ports: dict[str, Port], sizes: dict[str, int], bindings: dict, where: str) -> Trace:
        trace, cyclic = self._record(ports, sizes, bindings, where)
        if cyclic:
            # torch imports lazily on a process's first forward and leaves a reference cycle that
            # holds the frame's tensors until collected; once more, so no trace depends on that
            trace, _ = self._record(ports, sizes, bindings, where)
        return trace

    def _record(self, ports: dict[str, Port], sizes: dict[str, int], bindings: dict,
                where: str) -> tuple[Trace, bool]:
        """The step's trace, and whether reference cycles held some of its storages to its end."""
        inputs = self.inputs(ports, sizes)
        held = [t for b in bindings.values() for t in (b.persistent() if hasattr(b, "persistent") else ())]
        rec = _Recorder(self.known + list(inputs.values()) + held)    # a binding's pools exist before the step
        blocks = Memo(rec)                        # repeated layers traced once (graphc/layer_memo.py)
        wrapped = blocks.install(self.module)
        collecting = gc.isenabled()
        gc.disable()
        try:
            with rec, torch.no_grad():
                out = self.module(StepContext(bindings), **inputs)
                self._check_outputs(out, sizes, where)
                out_bytes = sum(t.untyped_storage().nbytes() for t in out.values())
                del out
            del inputs
        except InvalidInput:
            raise
        except Exception as e:
            raise InvalidInput(f"{where}: the forward fails on fake tensors: {type(e).__name__}: {e}",
                               "a step the compiler cannot trace without data cannot be captured either "
                               "(data-dependent shapes, host syncs, device-specific code)",
                               "keep shapes static and the forward free of .item()/.tolist() and device checks") from e
        finally:
            Memo.uninstall(wrapped)
            if collecting:
                gc.enable()
        cyclic = rec.live > 0
        if cyclic:
            gc.collect()             # what only cycles held dies now, at the step's end
        if rec.live:
            raise InvalidInput(f"{where}: the forward keeps {rec.live:,} B of tensors alive after its step",
                               "a step must hold nothing past its outputs (module attributes set in forward): "
                               "a captured graph would pin them in the pool, and the next trace of the same "
                               "module would not see them again",
                               "compute caches in __init__ as buffers, and free temporaries before returning")
        return Trace(tuple(rec.events), rec.peak, out_bytes, rec.ops, rec.launches, tuple(rec.convs)), cyclic

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
