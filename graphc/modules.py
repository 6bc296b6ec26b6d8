"""Building a node's module the same way in the compiler (meta / fake) and the runtime (real).

Parameters take the node's dtype; buffers keep the dtype the module gave them (rotary tables stay
fp32). Weights live in one arena per node: every tensor 256-byte aligned, one allocation.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graphc import memo
from graphc.declare import Node
from graphc.errors import GraphcError, InvalidInput
from graphc.units import round_up

if TYPE_CHECKING:
    import torch

ARENA_ALIGN = 256


# kernel choices a plan makes for a node's modules (select_backends): class attributes a module declares
# with its default, set per instance by set_kernels where the plan chooses otherwise
KERNEL_KNOBS = ("fla_gdn", "gdn_conv_rows", "gdn_fused", "gdn_slots", "frame_attend", "fused_gelu", "fused_max_tokens",
                "fused_norms", "fused_rope", "fused_router", "fused_sampler", "gated_rope", "gemm_rows", "gemv",
                "gemv_swiglu", "moe_pair_tokens", "moe_route_group", "moe_shared_sum", "moe_sm90_from", "moe_sum_norm", "norm_gemv",
                "norm_rows", "pdl", "select_fold")


def arrange_weights(module: torch.nn.Module) -> None:
    """After a node's weights are loaded and its knobs set (boot): every submodule that lays its weights out for
    the kernels the knobs chose (arrange_weights, e.g. the MoE experts' rows for the SM90 kernels) does so."""
    for m in module.modules():
        if m is not module and hasattr(m, "arrange_weights"):
            m.arrange_weights()


def set_kernels(module: torch.nn.Module, kernels: dict[str, int]) -> set[str]:
    """Give every submodule that declares a knob the plan's value (or back its class default where the
    plan has none); the knobs some submodule declares."""
    unknown = set(kernels) - set(KERNEL_KNOBS)
    if unknown:
        raise ValueError(f"unknown kernel choices {sorted(unknown)}; known: {list(KERNEL_KNOBS)}")
    found = set()
    for m, knobs in _knob_sites(module):
        for knob in knobs:
            found.add(knob)
            if knob in kernels:
                setattr(m, knob, kernels[knob])
            else:
                m.__dict__.pop(knob, None)
    return found


_SITES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _knob_sites(module: torch.nn.Module) -> list[tuple[torch.nn.Module, tuple[str, ...]]]:
    """The submodules that declare knobs, each with its knobs: found once a module (a built module's tree does
    not change; the simulation sets a node's knobs before each of its traces)."""
    sites = _SITES.get(module)
    if sites is None:
        found = ((m, tuple(k for k in KERNEL_KNOBS if hasattr(type(m), k))) for m in module.modules())
        sites = _SITES[module] = [(m, knobs) for m, knobs in found if knobs]
    return sites


def node_key(node: Node) -> tuple:
    """What a node's module is built from: its module, config and dtype (the key of every per-module cache)."""
    return (node.module, repr(node.config), node.dtype)


_META: dict[tuple, torch.nn.Module] = memo.table("modules.meta")     # emptied with the other memos (memo.clear)


def meta_module(node: Node) -> torch.nn.Module:
    """The node's module on the meta device, built once a process for all the passes that read it (weight
    sizes, the simulation's traces, the knobs it declares): it holds no data, and a pass that sets its
    kernel knobs (set_kernels) sets them before each use."""
    key = node_key(node)
    if key not in _META:
        _META[key] = build_module(node, "meta")
    return _META[key]


def build_module(node: Node, device: str | torch.device = "meta") -> torch.nn.Module:
    import torch                        # here: a plan made from the disk cache builds no module

    from graphc.step import TORCH_DTYPES

    with torch.device(device):
        try:
            module = node.build()
        except Exception as e:
            if str(device) != "meta" or isinstance(e, GraphcError):
                raise
            # the compiler's build (meta): a module that cannot be built from its config is the declaration's fault
            raise InvalidInput(f"node '{node.name}': {node.module_name} fails to build from its config: "
                               f"{type(e).__name__}: {e}",
                               "the compiler builds each node's module on the meta device to size its weights",
                               f"give {node.name} a config {node.module_name} accepts") from e
    dtype = TORCH_DTYPES[node.dtype]
    for p in module.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    return module.eval()


@dataclass(frozen=True)
class WeightSizes:
    params: int          # raw parameter bytes (tied weights once)
    num_params: int
    buffers: int         # raw buffer bytes (persistent and not)
    arena: int           # params + buffers, each aligned to ARENA_ALIGN: one allocation
    num_tensors: int


def tensors_for_arena(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Parameters (deduplicated) then buffers, in a fixed order the runtime lays out identically."""
    out = list(module.named_parameters())
    out += [(n, b) for n, b in module.named_buffers()]
    return out


def weight_sizes(module: torch.nn.Module) -> WeightSizes:
    params = list(module.parameters())
    p_bytes = sum(p.numel() * p.element_size() for p in params)
    b_bytes = sum(b.numel() * b.element_size() for b in module.buffers())
    tensors = tensors_for_arena(module)
    arena = sum(round_up(t.numel() * t.element_size(), ARENA_ALIGN) for _, t in tensors)
    return WeightSizes(params=p_bytes, num_params=sum(p.numel() for p in params), buffers=b_bytes,
                       arena=arena, num_tensors=len(tensors))
