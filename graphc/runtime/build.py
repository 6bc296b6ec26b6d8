"""Build a plan's node modules on a device: parameters and buffers in one arena per node.

The module is constructed with its parameters on the meta device (a registration hook swaps them,
so no host memory is spent on 60 GB of weights) and its buffers real on the CPU (rotary tables are
computed in __init__). Then every tensor becomes a view into the node's arena, in the order and
alignment the compiler's ledger assumed (graphc.modules.tensors_for_arena, ARENA_ALIGN).
"""
from __future__ import annotations

import torch
from torch.nn.modules.module import register_module_parameter_registration_hook

from graphc.declare import Node
from graphc.modules import ARENA_ALIGN, tensors_for_arena
from graphc.step import TORCH_DTYPES
from graphc.units import round_up


def _params_on_meta(module, name, param):
    if param is None or param.device.type == "meta":
        return None
    return torch.nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=False)


def build_shell(node: Node) -> torch.nn.Module:
    """The node's module with meta parameters (in the node's dtype) and real CPU buffers."""
    hook = register_module_parameter_registration_hook(_params_on_meta)
    try:
        with torch.device("cpu"):
            module = node.build()
    finally:
        hook.remove()
    dtype = TORCH_DTYPES[node.dtype]
    for p in module.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    return module.eval()


def _replace(module: torch.nn.Module, old_to_new: dict[int, torch.Tensor], kind: str) -> None:
    for sub in module.modules():
        table = sub._parameters if kind == "param" else sub._buffers
        for name, t in list(table.items()):
            if t is not None and id(t) in old_to_new:
                table[name] = old_to_new[id(t)]


def materialize(node: Node, device: torch.device) -> tuple[torch.nn.Module, torch.Tensor]:
    """The module with every parameter and buffer a view into one uint8 arena on the device."""
    module = build_shell(node)
    tensors = tensors_for_arena(module)
    sizes = [round_up(t.numel() * t.element_size(), ARENA_ALIGN) for _, t in tensors]
    arena = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    new_params, new_buffers, offset = {}, {}, 0
    params = {id(p) for p in module.parameters()}
    for (name, t), size in zip(tensors, sizes):
        n = t.numel() * t.element_size()
        view = arena[offset:offset + n].view(t.dtype).view(t.shape)
        if id(t) in params:
            new_params[id(t)] = torch.nn.Parameter(view, requires_grad=False)
        else:
            view.copy_(t)                     # buffers carry values computed in __init__
            new_buffers[id(t)] = view
        offset += size
    _replace(module, new_params, "param")
    _replace(module, new_buffers, "buffer")
    return module, arena


def fill_seeded(module: torch.nn.Module, seed: int) -> None:
    """Weights from a seeded generator when no checkpoint is given: small normal matrices, unit
    norm scales, zero biases; deterministic per (seed, tensor order) on any device."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for i, (name, p) in enumerate(module.named_parameters()):
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                g = torch.Generator(device=p.device).manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
                p.normal_(0.0, 0.02, generator=g)
