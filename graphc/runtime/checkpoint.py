"""Load a node's weights from safetensors by their public on-disk names.

Disk names are the node's weight_prefix + the module's state-dict names, except for stacked matrices:
- MoE experts: on disk each expert is its own tensors (experts.E.{gate,up,down}_proj.weight); in memory
  they are fused for the MoE kernels (experts.gate_up_proj [E, 2I, H] = gate then up, experts.down_proj
  [E, H, I]). Either form loads. (After loading, the boot may lay gate_up_proj's rows out for the plan's
  kernels: Experts.arrange_weights.)
- Dense projections run as one GEMM: self_attn.qkv_proj.weight holds q_proj's rows, then k_proj's, then
  v_proj's; mlp.gate_up_proj.weight gate_proj's, then up_proj's (biases alike). Either form loads.
Shards are found through model.safetensors.index.json or by listing the folder; TensorShards reads a state
dict in memory the same way. Missing, unexpected and mis-shaped tensors are refused by name.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from graphc.errors import InvalidInput

_FUSED = re.compile(r"^(?P<stem>.*experts\.)(?P<kind>gate_up_proj|down_proj)$")
_STACKED = re.compile(r"^(?P<stem>(?:.*\.)?)(?P<kind>qkv_proj|gate_up_proj)\.(?P<field>weight|bias)$")
_STACKED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
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

    def get(self, name: str) -> torch.Tensor:
        f = self.where[name]
        if f not in self._open:
            self._open[f] = safe_open(str(f), "pt")
        return self._open[f].get_tensor(name)

    def shape(self, name: str) -> tuple[int, ...]:
        f = self.where[name]
        if f not in self._open:
            self._open[f] = safe_open(str(f), "pt")
        return tuple(self._open[f].get_slice(name).get_shape())


class TensorShards(Shards):
    """A state dict in memory read as a checkpoint: the same names, stacking and checks as files get."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = dict(tensors)
        self.where = dict.fromkeys(self.tensors)

    def get(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].shape)


@dataclass
class LoadReport:
    loaded: int = 0
    fused: int = 0
    used: set[str] = field(default_factory=set)


def _expert_names(prefix: str, stem: str, kind: str, e: int) -> list[str]:
    base = f"{prefix}{stem}{e}."
    return [base + "gate_proj.weight", base + "up_proj.weight"] if kind == "gate_up_proj" else [base + "down_proj.weight"]


def _read(shards: Shards, prefix: str, name: str, target: torch.Tensor, report: LoadReport) -> torch.Tensor | str:
    """The tensor for one state-dict entry, or a string saying what is wrong."""
    disk = prefix + name
    if disk in shards:
        report.used.add(disk)
        t = shards.get(disk)
        return t if tuple(t.shape) == tuple(target.shape) else f"{disk}: on disk {list(t.shape)}, module wants {list(target.shape)}"
    st = _STACKED.match(name)
    if st:
        names = [f"{prefix}{st['stem']}{part}.{st['field']}" for part in _STACKED_PARTS[st["kind"]]]
        absent = [n for n in names if n not in shards]
        if absent:
            return f"{disk}: missing (nor {', '.join(absent)})"
        t = torch.cat([shards.get(n) for n in names], 0)
        report.used.update(names)
        report.fused += 1
        return t if tuple(t.shape) == tuple(target.shape) else \
            f"{disk}: {' + '.join(names)} stack to {list(t.shape)}, module wants {list(target.shape)}"
    m = _FUSED.match(name)
    if not m:
        return f"{disk}: missing"
    stem, kind, experts = m["stem"], m["kind"], target.shape[0]
    parts = []
    for e in range(experts):
        names = _expert_names(prefix, stem, kind, e)
        absent = [n for n in names if n not in shards]
        if absent:
            return f"{disk}: missing (nor per-expert {absent[0]})"
        pieces = [shards.get(n) for n in names]
        report.used.update(names)
        parts.append(torch.cat(pieces, 0) if kind == "gate_up_proj" else pieces[0])
    t = torch.stack(parts)
    report.fused += 1
    return t if tuple(t.shape) == tuple(target.shape) else \
        f"{disk}: per-expert tensors fuse to {list(t.shape)}, module wants {list(target.shape)}"


def load_weights(module: torch.nn.Module, source: str | Path | Shards, prefix: str = "",
                 strict: bool = True) -> LoadReport:
    """Copy a checkpoint's tensors into the module (cast to each tensor's dtype)."""
    shards = source if isinstance(source, Shards) else Shards(source)
    report = LoadReport()
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
                got = _read(shards, prefix, n, target, report)
                if isinstance(got, torch.Tensor):
                    break
            if isinstance(got, str):
                problems.append(got)
                continue
            target.data.copy_(got.to(target.dtype))
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
