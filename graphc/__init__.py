"""graphc: the public declaration API, nothing else."""
from graphc.declare import (AXES, Budget, Edge, Model, Node, Port, RequestKind, Walk)
from graphc.step import NodeModule, StepContext

__all__ = ["AXES", "Budget", "Edge", "Model", "Node", "NodeModule", "Port", "RequestKind", "StepContext",
           "Walk"]
