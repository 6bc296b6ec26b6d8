"""graphc: the public declaration API, and the Engine that serves a plan.

    import graphc as gc
    gc.Model, gc.Node, gc.Port, gc.Edge, gc.Link, gc.Walk, gc.Budget, gc.RequestKind, gc.AXES,
    gc.NodeModule, gc.StepContext
    graphc.Engine                       # serves a plan (graphc/runtime/engine.py; what `graphc run` drives)

Names resolve on first use, so `resources` (which builds on graphc.strict) and `graphc` can import
each other in either order.
"""
from __future__ import annotations

import importlib

_API = {"AXES": "graphc.declare", "Budget": "graphc.declare", "Edge": "graphc.declare", "Link": "graphc.declare", "Model": "graphc.declare",
        "Node": "graphc.declare", "Port": "graphc.declare", "RequestKind": "graphc.declare", "Walk": "graphc.declare",
        "NodeModule": "graphc.step", "StepContext": "graphc.step", "Engine": "graphc.runtime.engine"}

__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'graphc' has no attribute '{name}'")
