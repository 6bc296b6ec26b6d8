"""graphc: the public declaration API, and the Engine that serves a plan.

    import graphc as gc
    gc.Model, gc.Node, gc.Port, gc.Edge, gc.Link, gc.Walk, gc.Budget, gc.RequestKind, gc.AXES,
    gc.NodeModule, gc.StepContext, gc.Split
    gc.Pipeline, gc.LLMStage, gc.EncoderStage, gc.FollowStage, gc.ChunkStage      # how it is served
    gc.Host, gc.Speech, gc.Transcription, gc.Prompt, gc.Media, ...   # the contract its host() fulfils (graphc/serving.py)
    gc.Strict, gc.InvalidInput, gc.read_config, gc.ceil_div, gc.round_up, gc.MiB  # helpers model files use
    graphc.Engine                       # serves a plan (graphc/runtime/engine.py; what `graphc run` drives)

Names resolve on first use, so `resources` (which builds on graphc.strict) and `graphc` can import
each other in either order.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"          # pyproject.toml reads it from here

_API = {"AXES": "graphc.declare", "Budget": "graphc.declare", "Edge": "graphc.declare", "Link": "graphc.declare", "Model": "graphc.declare",
        "Node": "graphc.declare", "Port": "graphc.declare", "RequestKind": "graphc.declare", "Walk": "graphc.declare",
        "LLMStage": "graphc.stages", "EncoderStage": "graphc.stages", "FollowStage": "graphc.stages",
        "ChunkStage": "graphc.stages", "Pipeline": "graphc.stages",
        "Host": "graphc.serving", "Speech": "graphc.serving", "SpeechSampling": "graphc.serving",
        "FollowPrompt": "graphc.serving", "Slot": "graphc.serving", "Transcription": "graphc.serving",
        "Media": "graphc.serving", "MediaItem": "graphc.serving", "Piece": "graphc.serving", "Prompt": "graphc.serving",
        "SpreadFrames": "graphc.serving",
        "EncodeBatch": "graphc.serving", "expand_placeholders": "graphc.serving",
        "Strict": "graphc.strict", "InvalidInput": "graphc.errors", "read_config": "graphc.source",
        "ceil_div": "graphc.units", "round_up": "graphc.units", "MiB": "graphc.units",
        "NodeModule": "graphc.step", "StepContext": "graphc.step", "Split": "graphc.step", "Engine": "graphc.runtime.engine"}

__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'graphc' has no attribute '{name}'")
