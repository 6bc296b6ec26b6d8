"""Repeated blocks of a step traced once (issue 14): the simulation's layer memo.

A model's layers are one module class repeated (an LLM's decoder layers, a vision encoder's blocks, ...),
called one after the other on inputs of the same shapes. While a step is traced (simulate.FakeNode), every child
of an nn.ModuleList of three or more blocks goes through `Memo.call`. A block call is keyed by what can
change what it allocates: its class, the shapes and dtypes of its parameters and buffers, the plain
attributes of it and its submodules (ints, floats, strings: window sizes, kernel choices, a layer
index; read at its first call in a step, as a forward may not change them), and its arguments (tensors by shape, stride and dtype, not where a view starts; modules as blocks are; other
objects by identity, told apart from a dead object's reused id; a functools.partial by its function and arguments,
its ints and slices left out, since they pick a layer's cache or a frame's slot, and are checked below
instead).

The first two calls of a key run for real and their segments of the trace are kept, with the storages
they allocated numbered from 0. If the two are equal (allocations and frees in the same order and
sizes, the same ops, launches and convolutions) and the block's only storages alive at its end are its
outputs, every later call of the key is replayed: its segment appended with fresh storage keys, its
outputs made as new meta tensors of the recorded layouts and tracked like any other storage (their
frees land where CPython drops them). Otherwise the key always runs. A block that frees a storage older
than its call, or returns a view or an alias, is never replayed. The trace is then the one a full run
gives (tests/unit/test_layer_memo.py holds them equal event for event, and the shipped plans
byte-identical); `MEMO_ON = False` turns it off.
"""
from __future__ import annotations

import functools
import itertools
import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

from graphc.strided import storage_bytes

MEMO_ON = True
MIN_BLOCKS = 3          # a ModuleList of fewer is not a stack of layers


@dataclass(frozen=True)
class Segment:
    """A block call's part of a trace, its storages numbered from 0 in order of allocation."""

    events: tuple[tuple[int, int, int], ...]        # (1 alloc | 0 free, local key, bytes)
    locals: int                                     # storages allocated in it
    outputs: tuple[tuple[int, tuple, tuple, torch.dtype], ...]   # (local key, shape, stride, dtype) per leaf
    spec: object                                    # the output's pytree structure
    ops: int
    launches: int
    convs: tuple[tuple[int, str], ...]              # (events into the segment, signature)

    def same(self, other: "Segment") -> bool:
        return (self.events, self.locals, self.outputs, str(self.spec), self.ops, self.launches, self.convs) == (
            other.events, other.locals, other.outputs, str(other.spec), other.ops, other.launches, other.convs)


def _plain(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str)) or (
        isinstance(v, tuple) and all(_plain(x) for x in v))


def module_key(m: torch.nn.Module) -> tuple:
    """A block's type, and each of its modules' type and plain public attributes (kernel knobs, sizes, flags)
    and parameters' and buffers' shapes and dtypes, module by module in named_modules' order (a shared
    submodule once); walked through the modules' own dicts, named_modules' nested generators being a third of
    a cold plan's time in this key."""
    parts: list = [type(m)]
    seen: set[int] = set()

    def walk(prefix: str, sub: torch.nn.Module) -> None:
        seen.add(id(sub))
        d = vars(sub)
        parts.append((prefix, type(sub), tuple(sorted((k, v) for k, v in d.items()
                                                     if not k.startswith("_") and _plain(v)))))
        for kind in ("_parameters", "_buffers"):
            parts.extend((prefix, name, tuple(t.shape), t.dtype) for name, t in d[kind].items() if t is not None)
        for name, child in d["_modules"].items():
            if child is not None and id(child) not in seen:
                walk(f"{prefix}.{name}" if prefix else name, child)

    walk("", m)
    return tuple(parts)


def arg_key(a, ident, in_partial: bool = False):
    """What of a block's argument can change what the block allocates. ident(obj): a token for an object
    keyed by identity, the same while it lives."""
    if isinstance(a, torch.Tensor):      # not its storage offset: where a view starts does not size anything
        return ("T", tuple(a.shape), a.stride(), a.dtype, a.device.type)
    if isinstance(a, bool) or a is None or isinstance(a, (float, str)):
        return a
    if isinstance(a, int):
        return "int" if in_partial else a
    if isinstance(a, slice):
        return "slice" if in_partial else ("S", a.start, a.stop, a.step)
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(arg_key(x, ident, in_partial) for x in a))
    if isinstance(a, dict):
        return ("D", tuple(sorted((k, arg_key(v, ident, in_partial)) for k, v in a.items())))
    if isinstance(a, functools.partial):   # its ints and slices pick a layer's cache or a frame's slot
        return ("P", arg_key(a.func, ident), tuple(arg_key(x, ident, True) for x in a.args),
                tuple(sorted((k, arg_key(v, ident, True)) for k, v in a.keywords.items())))
    if isinstance(a, torch.nn.Module):   # a module handed to a block (the next layer's norm): what it is, as a block
        return ("N", module_key(a))
    if hasattr(a, "__self__") and hasattr(a, "__func__"):           # a bound method
        return ("M", ident(a.__func__), ident(a.__self__))
    return ("O", ident(a))


class Memo:
    """One step's block calls, on one recorder (simulate._Recorder)."""

    def __init__(self, rec):
        self.rec = rec
        self.seen: dict[tuple, object] = {}      # key -> ("first", Segment) | Segment | None (always run)
        self.replayed = 0
        self.idents: dict[int, tuple[weakref.ref, int]] = {}
        self.tokens = itertools.count()
        self.blocks: dict[int, tuple] = {}       # id(block) -> module_key (the blocks live as long as the module)

    def ident(self, obj) -> int:
        """A token for obj, the same while it lives and never another object's (an id alone may be reused
        once its object dies); not holding it, since that would move its storages' frees. TypeError for an
        object that takes no weak reference."""
        entry = self.idents.get(id(obj))
        if entry is not None and entry[0]() is obj:
            return entry[1]
        token = next(self.tokens)
        self.idents[id(obj)] = (weakref.ref(obj), token)
        return token

    def install(self, module: torch.nn.Module) -> list[torch.nn.Module]:
        """Route the blocks of every ModuleList of MIN_BLOCKS or more through call(); the wrapped ones."""
        wrapped = []
        if not MEMO_ON:
            return wrapped
        for m in module.modules():
            if isinstance(m, torch.nn.ModuleList) and len(m) >= MIN_BLOCKS:
                for block in m:
                    if "forward" not in vars(block):
                        block.forward = functools.partial(self.call, block, type(block).forward.__get__(block))
                        wrapped.append(block)
        return wrapped

    @staticmethod
    def uninstall(blocks: list[torch.nn.Module]) -> None:
        for b in blocks:
            vars(b).pop("forward", None)

    def call(self, block, forward, *args, **kwargs):
        try:
            mkey = self.blocks.get(id(block))
            if mkey is None:                     # read once a step: a forward must not change its attributes
                mkey = self.blocks[id(block)] = module_key(block)
            key = (mkey, arg_key(args, self.ident), arg_key(kwargs, self.ident))
            hash(key)
        except TypeError:                        # unhashable, or an object that takes no weak reference: run it
            return forward(*args, **kwargs)
        state = self.seen.get(key, False)
        if isinstance(state, Segment):
            return self.replay(state)
        if state is None:
            return forward(*args, **kwargs)
        rec = self.rec
        start, first_key, ops, launches, convs = len(rec.events), rec._next, rec.ops, rec.launches, len(rec.convs)
        out = forward(*args, **kwargs)
        seg = self.capture(start, first_key, ops, launches, convs, out)
        if seg is None:
            self.seen[key] = None
        elif state is False:
            self.seen[key] = ("first", seg)
        else:
            self.seen[key] = seg if seg.same(state[1]) else None
        return out

    def capture(self, start: int, first_key: int, ops: int, launches: int, convs: int, out) -> Segment | None:
        rec = self.rec
        events = rec.events[start:]
        if any(k < first_key for _, k, _ in events):        # freed a storage older than the call
            return None
        alive = {k for kind, k, _ in events if kind == 1} - {k for kind, k, _ in events if kind == 0}
        leaves, spec = tree_flatten(out)
        outputs = []
        for t in leaves:
            if not isinstance(t, torch.Tensor):
                return None
            s = t.untyped_storage()
            key = rec.keys.get(id(s))
            if key is None or key < first_key or t.storage_offset() or s.nbytes() != storage_bytes(t):
                return None                              # not a storage of its own, allocated in the call
            outputs.append((key - first_key, tuple(t.shape), t.stride(), t.dtype))
        if {k + first_key for k, *_ in outputs} != alive or len(outputs) != len(alive):
            return None                                  # something else outlives the call, or an output twice
        return Segment(tuple((kind, k - first_key, n) for kind, k, n in events), rec._next - first_key,
                       tuple(outputs), spec, rec.ops - ops, rec.launches - launches,
                       tuple((e - start, sig) for e, sig in rec.convs[convs:]))

    def replay(self, seg: Segment):
        rec = self.rec
        base = rec._next
        rec._next += seg.locals
        at = len(rec.events)
        for kind, k, n in seg.events:
            rec.events.append((kind, base + k, n))
            rec.live += n if kind == 1 else -n
            rec.peak = max(rec.peak, rec.live)
        rec.convs.extend((at + e, sig) for e, sig in seg.convs)
        rec.ops += seg.ops
        rec.launches += seg.launches
        leaves = []
        with _disable_current_modes():
            for k, shape, stride, dtype in seg.outputs:
                t = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
                rec.track(t.untyped_storage(), base + k)
                leaves.append(t)
        self.replayed += 1
        return tree_unflatten(leaves, seg.spec)

