"""Load a node's weights from safetensors by their public on-disk names.

Disk names are the node's weight_prefix + the module's state-dict names, except for stacked matrices:
- MoE experts: on disk each expert is its own tensors (experts.E.{gate,up,down}_proj.weight); in memory
  they are fused for the MoE kernels (experts.gate_up_proj [E, 2I, H] = gate then up, experts.down_proj
  [E, H, I]). Either form loads. (After loading, the boot may lay gate_up_proj's rows out for the plan's
  kernels: Experts.arrange_weights.)
- Dense projections run as one GEMM: self_attn.qkv_proj.weight holds q_proj's rows, then k_proj's, then
  v_proj's; mlp.gate_up_proj.weight gate_proj's, then up_proj's (biases alike). A module (any submodule)
  may stack others: its class's STACKS maps a stacked name to the disk names of its parts, in row order
  ({"in_proj_qkvzba": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")}). Either form loads.
Shards are found through model.safetensors.index.json or by listing the folder; TensorShards reads a state
dict in memory the same way. Missing, unexpected and mis-shaped tensors are refused by name, from the files'
headers, before a byte is read. Each disk tensor then goes straight into its place in the module,
hostmem.STAGING_BYTES of rows at a time: the host holds one chunk (cast to the module's dtype, where it differs) of the
weights at once, whatever the checkpoint's size. The plan counts that chunk (host.staging, size_host).
A tensor-parallel rank (load_weights' rank and tp) reads through RankShards: a split tensor (the module's
tp_splits(), graphc.Split) shows the rank's part as its shape and rows, read alone from the files, so the stacking
above runs unchanged on the rank's parts.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open

from graphc import hostmem
from graphc.errors import InvalidInput
from graphc.step import NodeModule, Split

_FUSED = re.compile(r"^(?P<stem>.*experts\.)(?P<kind>gate_up_proj|down_proj)$")
SHOWN = 8


class Shards:
    """Every tensor name in a checkpoint folder (or one file) and the file that holds it."""

    def __init__(self, source: str | Path):
        src = Path(source)
        if src.is_file():
            files = [src]
        elif src.is_dir():
            index = src / "model.safetensors.index.json"
            if index.exists():
                names = json.loads(index.read_text())["weight_map"]
                files = sorted({src / f for f in names.values()})
            else:
                files = sorted(src.glob("*.safetensors"))
        else:
            raise InvalidInput(f"checkpoint {source} does not exist", "", "pass a folder of .safetensors files or one file")
        if not files:
            raise InvalidInput(f"no .safetensors files in {source}", "", "point at the folder the checkpoint was saved in")
        self.where: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), "pt") as h:
                for k in h.keys():
                    self.where[k] = f
        self._open: dict[Path, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def _slice(self, name: str):
        f = self.where[name]
        if f not in self._open:
            self._open[f] = safe_open(str(f), "pt")
        return self._open[f].get_slice(name)

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows start:stop of a tensor (dim 0), read from the file alone: the host holds no more than them."""
        if not self.shape(name):                       # a scalar: read whole
            return self._open[self.where[name]].get_tensor(name)
        return self._slice(name)[start:stop]

    def part(self, name: str, index: tuple[slice, ...]) -> torch.Tensor:
        """The tensor's block at index (a slice per leading dim), read from the file alone."""
        return self._slice(name)[index]

    def copy_rows(self, name: str, start: int, stop: int, dest: torch.Tensor) -> None:
        """Rows start:stop into dest (cast to its dtype)."""
        dest.copy_(self.rows(name, start, stop))

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype:
        return _DTYPES[self._slice(name).get_dtype()]


class TensorShards(Shards):
    """A state dict in memory read as a checkpoint: the same names, stacking and checks as files get."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = dict(tensors)
        self.where = dict.fromkeys(self.tensors)

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        t = self.tensors[name]
        return t[start:stop] if t.dim() else t

    def part(self, name: str, index: tuple[slice, ...]) -> torch.Tensor:
        return self.tensors[name][index]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self.tensors[name].dtype


_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


@dataclass
class LoadReport:
    loaded: int = 0
    fused: int = 0
    used: set[str] = field(default_factory=set)


# (where in the target: an index into it, or () for all of it; the disk tensor that fills it)
Pieces = list[tuple[tuple, str]]


def _expert_names(prefix: str, stem: str, kind: str, e: int) -> list[str]:
    base = f"{prefix}{stem}{e}."
    return [base + "gate_proj.weight", base + "up_proj.weight"] if kind == "gate_up_proj" else [base + "down_proj.weight"]


def _stacked(shards: Shards, names: list[str], at: tuple = ()) -> tuple[Pieces, list[int]]:
    """Parts stacked along rows (into target[at]): each part's rows and the shape they stack to."""
    pieces, row, shapes = [], 0, [shards.shape(n) for n in names]
    for n, shp in zip(names, shapes):
        pieces.append((at + (slice(row, row + shp[0]),), n))
        row += shp[0]
    tails = {tuple(shp[1:]) for shp in shapes}
    return pieces, ([row, *shapes[0][1:]] if len(tails) == 1 else [row, "?"])


STACKS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def stacks_of(module: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    """The stacked projections a module loads: STACKS and its submodules' own (a class attribute STACKS)."""
    out = dict(STACKS)
    for m in module.modules():
        out.update(getattr(type(m), "STACKS", {}))
    return out


def _stacked_pattern(stacks: dict[str, tuple[str, ...]]) -> re.Pattern:
    """A state-dict name <stem><stacked>.weight|bias, for the stacked names of a module's STACKS."""
    kinds = "|".join(re.escape(k) for k in sorted(stacks, key=len, reverse=True))
    return re.compile(rf"^(?P<stem>(?:.*\.)?)(?P<kind>{kinds})\.(?P<field>weight|bias)$")


def _pieces(shards: Shards, prefix: str, name: str, target: torch.Tensor, stacks: dict[str, tuple[str, ...]]
            ) -> Pieces | str:
    """Where each disk tensor of one state-dict entry goes, or a string saying what is wrong. Shapes come
    from the files' headers: nothing is read yet. stacks: the module's STACKS."""
    disk, want = prefix + name, list(target.shape)
    if disk in shards:
        shp = list(shards.shape(disk))
        return [((), disk)] if shp == want else f"{disk}: on disk {shp}, module wants {want}"
    st = _stacked_pattern(stacks).match(name)
    if st:
        names = [f"{prefix}{st['stem']}{part}.{st['field']}" for part in stacks[st["kind"]]]
        absent = [n for n in names if n not in shards]
        if absent:
            return f"{disk}: missing (nor {', '.join(absent)})"
        pieces, shp = _stacked(shards, names)
        return pieces if shp == want else f"{disk}: {' + '.join(names)} stack to {shp}, module wants {want}"
    m = _FUSED.match(name)
    if not m:
        return f"{disk}: missing"
    pieces, shapes = [], []
    for e in range(target.shape[0]):
        names = _expert_names(prefix, m["stem"], m["kind"], e)
        absent = [n for n in names if n not in shards]
        if absent:
            return f"{disk}: missing (nor per-expert {absent[0]})"
        part, shp = _stacked(shards, names, (e,))
        pieces += part
        shapes.append(shp)
    shp = [len(shapes), *shapes[0]] if len({tuple(s) for s in shapes}) == 1 else [len(shapes), "?"]
    return pieces if shp == want else f"{disk}: per-expert tensors fuse to {shp}, module wants {want}"


def _copy(shards: Shards, name: str, dest: torch.Tensor, on_bytes: Callable[[int], None] | None = None) -> None:
    """One disk tensor into dest, hostmem.STAGING_BYTES of rows at a time (a row at least): the host never holds a
    whole large tensor. copy_ casts to dest's dtype (on the host, before a host-to-device copy). on_bytes(n): told
    the bytes of dest each chunk filled."""
    shape = shards.shape(name)
    rows = shape[0] if shape else 1
    row_bytes = max(1, math.prod(shape[1:]) * max(shards.dtype(name).itemsize, dest.element_size()))
    step = max(1, hostmem.STAGING_BYTES // row_bytes)
    for r in range(0, rows, step):
        part = dest[r:r + step] if shape else dest
        shards.copy_rows(name, r, min(rows, r + step), part)
        if on_bytes is not None:
            on_bytes(part.numel() * part.element_size())


def load_weights(module: torch.nn.Module, source: str | Path | Shards, prefix: str = "", strict: bool = True,
                 on_bytes: Callable[[int], None] | None = None, rank: int = 0, tp: int = 1) -> LoadReport:
    """Copy a checkpoint's tensors into the module (cast to each tensor's dtype), in row chunks; on_bytes(n) is
    told the module's bytes each chunk filled (the boot's progress). tp > 1: the module is tensor-parallel rank
    `rank`'s part; its tp_splits() (a NodeModule's) say which part of each disk tensor it loads."""
    shards = source if isinstance(source, Shards) else Shards(source)
    if (rank, tp) != (0, 1):
        shards = RankShards(shards, module.tp_splits() if isinstance(module, NodeModule) else [], rank, tp, prefix)
    report = LoadReport()
    stacks = stacks_of(module)
    state = module.state_dict(keep_vars=True)
    aliases: dict[int, list[str]] = {}
    for name, t in state.items():
        aliases.setdefault(id(t), []).append(name)
    problems = []
    with torch.no_grad():
        for names in aliases.values():
            target = state[names[0]]
            got = None
            for n in names:                       # tied weights: any one alias on disk is enough
                got = _pieces(shards, prefix, n, target, stacks)
                if not isinstance(got, str):
                    break
            if isinstance(got, str):
                problems.append(got)
                continue
            for at, disk in got:
                _copy(shards, disk, target.data[at] if at else target.data, on_bytes)
                report.used.add(disk)
            report.fused += int(len(got) > 1 or got[0][1] != prefix + n)     # stacked or fused on disk
            report.loaded += 1
    unexpected = sorted(n for n in shards.where if n.startswith(prefix) and n not in report.used) if strict else []
    if problems or unexpected:
        lines = [f"  {p}" for p in problems[:SHOWN]] + ([f"  ... and {len(problems) - SHOWN} more"] if len(problems) > SHOWN else [])
        lines += [f"  unexpected: {n}" for n in unexpected[:SHOWN]]
        lines += [f"  ... and {len(unexpected) - SHOWN} more unexpected"] if len(unexpected) > SHOWN else []
        raise InvalidInput(f"checkpoint does not match {type(module).__name__} under prefix '{prefix}': "
                           f"{len(problems)} missing or mis-shaped, {len(unexpected)} unexpected",
                           "\n".join(lines), "check the checkpoint, the node's weight_prefix and its config")
    return report


class RankShards(Shards):
    """Tensor-parallel rank `rank` of `tp`'s view of a checkpoint: a disk tensor that a Split matches (its name
    after `prefix`) shows the rank's part as its shape, rows and parts, each read alone (never the whole tensor);
    any other tensor is itself. Every split tensor's lengths are checked when the view is made, before a byte is
    read: refused (InvalidInput) where a Split's dim is not an axis of its tensor, its blocks do not sum to the
    axis, or tp does not divide a length, or where two Splits match one name."""

    def __init__(self, base: Shards, splits: list[Split], rank: int, tp: int, prefix: str = ""):
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or not 0 <= rank < tp:
            raise InvalidInput(f"tensor-parallel rank {rank!r} of {tp!r}", "ranks count 0 to tp - 1, tp 1 or more",
                               "pass 0 <= rank < tp")
        self.base, self.where, self.rank, self.tp = base, base.where, rank, tp
        self.ranges: dict[str, tuple[int, list[tuple[int, int]]]] = {}     # name -> (dim, the rank's spans)
        for name in base.where:
            if name.startswith(prefix):
                split = _split_of(name, name[len(prefix):], splits)
                if split is not None:
                    self.ranges[name] = (split.dim, _rank_spans(name, base.shape(name), split, rank, tp))

    def shape(self, name: str) -> tuple[int, ...]:
        shape = self.base.shape(name)
        if name not in self.ranges:
            return shape
        dim, spans = self.ranges[name]
        return shape[:dim] + (sum(b - a for a, b in spans),) + shape[dim + 1:]

    def dtype(self, name: str) -> torch.dtype:
        return self.base.dtype(name)

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        if name not in self.ranges:
            return self.base.rows(name, start, stop)
        shape = self.shape(name)
        out = torch.empty((min(stop, shape[0]) - start,) + shape[1:], dtype=self.dtype(name))
        self.copy_rows(name, start, stop, out)
        return out

    def part(self, name: str, index: tuple[slice, ...]) -> torch.Tensor:
        raise NotImplementedError("RankShards reads rows (rows, copy_rows); a rank's part is not sliced again")

    def copy_rows(self, name: str, start: int, stop: int, dest: torch.Tensor) -> None:
        """Rows start:stop of the rank's part into dest, a span of the disk tensor at a time."""
        if name not in self.ranges:
            return self.base.copy_rows(name, start, stop, dest)
        dim, spans = self.ranges[name]
        at = 0                                            # where each span lies along dim in the rank's part
        for a, b in spans:
            if dim:
                index = (slice(start, stop),) + (slice(None),) * (dim - 1) + (slice(a, b),)
                dest[(slice(None),) * dim + (slice(at, at + b - a),)].copy_(self.base.part(name, index))
            else:                                         # the rank's rows start:stop that fall in this span
                lo, hi = max(start, at), min(stop, at + b - a)
                if lo < hi:
                    self.base.copy_rows(name, a + lo - at, a + hi - at, dest[lo - start:hi - start])
            at += b - a


def _split_of(name: str, local: str, splits: list[Split]) -> Split | None:
    """The one Split whose pattern matches local (name after the node's prefix), or None."""
    hits = [s for s in splits if s.matches(local)]
    if len(hits) > 1:
        raise InvalidInput(f"{name}: {len(hits)} tensor-parallel splits match it: "
                           + ", ".join(repr(s.pattern) for s in hits), "a disk tensor is cut one way",
                           "fix the module's tp_splits() so that at most one pattern matches each name")
    return hits[0] if hits else None


def _rank_spans(name: str, shape: tuple[int, ...], split: Split, rank: int, tp: int) -> list[tuple[int, int]]:
    """[start, stop) along split.dim of the rank's part of each block, in order."""
    if split.dim >= len(shape):
        raise InvalidInput(f"{name}: a tensor-parallel split on dim {split.dim} of a tensor of shape {list(shape)}",
                           "a split cuts one of the tensor's axes", "fix the module's tp_splits()")
    n = shape[split.dim]
    blocks = split.blocks or (n,)
    if sum(blocks) != n or any(b % tp for b in blocks):
        why = (f"its blocks {list(blocks)} sum to {sum(blocks)}, not the axis' length {n}" if sum(blocks) != n
               else f"tp {tp} does not divide its length{'s' if len(blocks) > 1 else ''} {list(blocks)}")
        raise InvalidInput(f"{name}: dim {split.dim} of shape {list(shape)} cannot be cut in {tp} parts: {why}",
                           "each rank takes an equal part of each block",
                           "use a tp that divides every split length, or fix the module's config or tp_splits()")
    spans, start = [], 0
    for b in blocks:
        part = b // tp
        spans.append((start + rank * part, start + (rank + 1) * part))
        start += b
    return spans
