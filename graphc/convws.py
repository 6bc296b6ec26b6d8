"""cuDNN's convolution workspaces: what each convolution of a step takes from torch's allocator.

cuDNN picks a convolution's engine by its own heuristics, and the engine's workspace, allocated
through torch after the output and freed as the call returns, lands in the capture pool when the
step is captured (912 MiB for an audio decoder's steps on the H200). No trace on the CPU can
derive it, so it is measured once per convolution signature on the target's arch
(examples/tools/calibrate_convs.py) and kept in graphc/conv_workspaces.yaml; resolve() puts each measured
workspace into a trace as a transient allocation where the convolution runs. A signature with no
measurement counts as no workspace and is reported (the plan's capture_pool line names how many).
"""
from __future__ import annotations

import re
from dataclasses import replace
from functools import lru_cache

from graphc.trace import Trace
from graphc.targets import package_yaml

FILE = "conv_workspaces.yaml"


@lru_cache(maxsize=None)
def _table() -> dict:
    return (package_yaml(FILE) or {}).get("entries", {})


def workspaces(arch: str) -> dict[str, int]:
    """{signature: workspace bytes} measured on this arch."""
    return dict(_table().get(arch, {}).get("workspaces", {}))


def source(arch: str) -> str:
    m = _table().get(arch, {}).get("measured")
    if not m:
        return f"no convolution workspaces measured on {arch}"
    return f"measured on {m['device']} on {m['date']} ({m['versions']}): {m['how']}"


def resolve(trace: Trace, arch: str) -> tuple[Trace, frozenset[str]]:
    """The trace with each convolution's measured workspace allocated and freed where it runs, and
    the signatures that have no measurement."""
    if not trace.convs:
        return trace, frozenset()
    table = workspaces(arch)
    events = list(trace.events)
    missing = set()
    for i, (at, sig) in reversed(list(enumerate(trace.convs))):
        ws = table.get(sig)
        if ws is None:
            missing.add(sig)
        elif ws:
            events[at:at] = [(1, -1 - i, ws), (0, -1 - i, ws)]
    live = peak = 0
    for kind, _, n in events:
        live += n if kind else -n
        peak = max(peak, live)
    out = replace(trace, events=tuple(events), peak_bytes=peak)
    return out, frozenset(missing)


SIGNATURE = re.compile(r"^(?P<kind>convT?) x\[(?P<x>[\d,]+)\] w\[(?P<w>[\d,]+)\] (?P<dtype>\w+)(?P<bias> bias)?"
                       r" s(?P<s>[\d,]+) p(?P<p>[\d,]+) d(?P<d>[\d,]+) op(?P<op>[\d,]+) g(?P<g>\d+)$")


def convolution(sig: str, device):
    """A call of one convolution of this signature on the device, with random inputs made now:
    calling it runs aten.convolution (cuDNN chooses and caches its engine on the first call)."""
    import torch

    m = SIGNATURE.match(sig)
    if m is None:
        raise ValueError(f"not a convolution signature: {sig!r}")

    def ints(text: str) -> list[int]:
        return [int(v) for v in text.split(",")]

    dtype = getattr(torch, m["dtype"])
    x = torch.randn(ints(m["x"]), dtype=dtype, device=device)
    w = torch.randn(ints(m["w"]), dtype=dtype, device=device)
    transposed, groups = m["kind"] == "convT", int(m["g"])
    b = torch.randn(w.shape[1] * groups if transposed else w.shape[0], dtype=dtype, device=device) \
        if m["bias"] else None

    def call():
        with torch.inference_mode():
            return torch.ops.aten.convolution(x, w, b, ints(m["s"]), ints(m["p"]), ints(m["d"]), transposed,
                                              ints(m["op"]), groups)
    return call
