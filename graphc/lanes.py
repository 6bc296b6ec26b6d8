"""Stream lanes: nodes whose steps run on a CUDA stream of their own, beside the device's main stream.

The engine takes its lanes in turn on the host (the LLM's step, the follow stage's, the chunk stage's), but on
one stream the GPU runs their steps one after the other. `--set lanes.<follow stage>=true` gives the follow
stage and its chunk stage (a speaking model's second autoregressive stage and its audio decoder) a stream of
their own on each GPU that also holds other nodes, so their steps can run while the LLM's run.

Two graphs that may run at once cannot share intermediate memory: a lane's graphs are captured into a capture
pool of their own, on a capture stream of their own. The plan pays for it: a ledger line
`capture_pool.<lane>` beside `capture_pool`, each the allocator model of its own graphs (its own cuBLAS
workspace included). A lane's nodes must run every step captured (an eager step on the lane's stream would need
activations of its own, which the plan does not model), so lanes are for GPU targets only.
"""
from __future__ import annotations

from graphc.declare import Model
from graphc.errors import InvalidInput
from graphc.strict import closest

SECTION = "lanes"


def choices(model: Model) -> list[str]:
    """The lanes a model can have: its follow stage's name (the follow and chunk stages), if it has one."""
    follow = model.pipeline.follow if model.pipeline is not None else None
    return [follow.name] if follow is not None else []


def settings(model: Model, given) -> dict[str, bool]:
    """--set lanes.<stage>=true|false checked: a mapping of the model's lane names (choices()) to booleans."""
    if given is None:
        return {}
    valid = choices(model)
    if not isinstance(given, dict):
        raise InvalidInput(f"overrides.{SECTION} must map follow stages to true or false", f"got {given!r}",
                           f"e.g. --set {SECTION}.{valid[0] if valid else 'STAGE'}=true")
    for name, on in given.items():
        if name not in valid:
            hint = closest(str(name), valid)
            raise InvalidInput(f"unknown lane '{name}' in overrides at {SECTION}",
                               f"a lane is a follow stage (with its chunk stage) on a stream of its own; this "
                               f"model's: {', '.join(valid) or '(none: it has no follow stage)'}",
                               f"use '{hint}'" if hint else f"remove {SECTION}.{name}")
        if not isinstance(on, bool):
            raise InvalidInput(f"{SECTION}.{name}={on!r} is not true or false",
                               f"true runs stage {name}'s steps on a CUDA stream of their own",
                               f"--set {SECTION}.{name}=true")
    return dict(given)


def lane_nodes(model: Model, given: dict[str, bool]) -> dict[str, list[str]]:
    """Lane name -> its nodes (the follow stage's, then its chunk stage's), for the lanes turned on."""
    p = model.pipeline
    return {name: [p.follow.node, p.chunk.node] for name, on in sorted(given.items()) if on}


def on_device(lanes: dict[str, list[str]], nodes: list[str]) -> dict[str, list[str]]:
    """The lanes of one device: each lane's nodes there, where the device also holds nodes outside every lane
    (on a device of lane nodes only, one stream already runs nothing else)."""
    inside = {n for ns in lanes.values() for n in ns}
    if not any(n not in inside for n in nodes):
        return {}
    return {name: [n for n in ns if n in nodes] for name, ns in lanes.items() if any(n in nodes for n in ns)}


def check(ir, buckets, lanes: dict[str, list[str]]) -> None:
    """A lane needs a GPU target that captures graphs, and every step of its nodes captured (buckets: the
    compiler's choose_buckets)."""
    if not lanes:
        return
    name = next(iter(lanes))
    if not (ir.target.is_gpu and ir.target.capture):
        raise InvalidInput(f"--set {SECTION}.{name}=true needs a GPU target",
                           f"target {ir.target.name} runs no CUDA streams and captures no graphs",
                           f"remove {SECTION}.{name}, or plan for a GPU (--gpu h100)")
    for name, nodes in lanes.items():
        for (node, walk), size in sorted(buckets.eager.items()):
            if node in nodes:
                raise InvalidInput(f"lane {name}: {node}'s steps on walk {walk} run eagerly up to {size:,}",
                                   "a lane's steps run on its own stream from its own capture pool; eager steps "
                                   "there would need activations the plan does not model",
                                   f"capture the walk whole (walks.{walk}.capture=true, no capture_limit) or "
                                   f"remove {SECTION}.{name}")
