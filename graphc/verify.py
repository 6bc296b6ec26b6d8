"""Check a declaration against a target and build the IR: real paths, agreeing ports, no strays.

Core, not a compiler pass: the pipeline starts with it, and the runtime rebuilds a plan's steps
with it (graphc/runtime never imports graphc/passes)."""
from __future__ import annotations

from graphc import memo
from graphc.declare import Model, ModuleRef, Node
from graphc.errors import InvalidInput
from graphc.ir import IR, build_ir, capture_axis, fed_inputs, walk_sizes
from graphc.targets import Target
from resources.ragged_attention import RaggedAttentionSpec
from resources.workspace import WorkspaceSpec


def verify_graph(model: Model, target: Target, num_devices: int) -> IR:
    if num_devices < 1:
        raise InvalidInput(f"--gpus {num_devices} must be at least 1")
    _check_nodes(model, num_devices)
    _check_edges(model)
    _check_walks(model)
    _check_segments(model)
    _check_requests(model)
    _check_resources(model)
    ir = build_ir(model, target, num_devices)
    ir.check()
    return ir


_ROLES: dict[tuple, tuple[tuple[str, str], ...]] = memo.table("verify.roles")


def module_roles(node: Node) -> dict[str, str]:
    """The roles the node's module calls (its class's ROLES). Those of a module named by import path are kept
    in the disk cache, so that a cached plan does not import it (a class given is asked: two classes made by
    one factory share their name and file)."""
    if not isinstance(node.module, ModuleRef):
        return dict(getattr(node.module, "ROLES", {}))
    key = (node.module,)
    if key not in _ROLES:
        _ROLES[key] = tuple(sorted(getattr(node.module_class, "ROLES", {}).items()))
    return dict(_ROLES[key])


def _check_nodes(model: Model, num_devices: int) -> None:
    names = {r.name: r for r in model.resources}
    for n in model.nodes:
        roles = module_roles(n)
        missing, extra = set(roles) - set(n.resources), set(n.resources) - set(roles)
        if missing:
            raise InvalidInput(f"node '{n.name}' does not bind role(s) {sorted(missing)}",
                               f"{n.module_name}.ROLES asks for {roles}",
                               f"add resources={{{', '.join(repr(r) + ': <resource>' for r in sorted(missing))}}}")
        if extra:
            raise InvalidInput(f"node '{n.name}' binds role(s) {sorted(extra)} its module does not call",
                               f"{n.module_name}.ROLES is {roles}", "remove them from the node's resources")
        for role, res in n.resources.items():
            if res not in names:
                raise InvalidInput(f"node '{n.name}' binds role '{role}' to unknown resource '{res}'",
                                   f"declared resources: {', '.join(names) or '(none)'}", "declare it or fix the name")
            if names[res].kind != roles[role]:
                raise InvalidInput(f"node '{n.name}' role '{role}' needs a {roles[role]} resource",
                                   f"'{res}' is a {names[res].kind}", f"bind '{role}' to a {roles[role]} resource")
        if n.device is not None and n.device >= num_devices:
            raise InvalidInput(f"node '{n.name}' is pinned to device {n.device}",
                               f"the plan has {num_devices} device(s), numbered from 0",
                               f"use --gpus {n.device + 1} or --set nodes.{n.name}.device=<0..{num_devices - 1}>")
        if not n.inputs:
            raise InvalidInput(f"node '{n.name}' declares no inputs", "every node is fed by a step",
                               "declare its input ports")


def _check_edges(model: Model) -> None:
    fed: dict[tuple[str, str], str] = {}
    nodes = {n.name: n for n in model.nodes}
    for e in model.edges:
        (src, sp), (dst, dp) = e.ends()
        for name in (src, dst):
            if name not in nodes:
                raise InvalidInput(f"edge {e.src} -> {e.dst} names unknown node '{name}'",
                                   f"nodes: {', '.join(nodes)}", "fix the edge")
        if sp not in nodes[src].outputs:
            raise InvalidInput(f"edge {e.src} -> {e.dst}: '{src}' has no output '{sp}'",
                               f"its outputs: {', '.join(nodes[src].outputs)}", "fix the edge")
        if dp not in nodes[dst].inputs:
            raise InvalidInput(f"edge {e.src} -> {e.dst}: '{dst}' has no input '{dp}'",
                               f"its inputs: {', '.join(nodes[dst].inputs)}", "fix the edge")
        a, b = nodes[src].outputs[sp], nodes[dst].inputs[dp]
        if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
            raise InvalidInput(f"edge {e.src} -> {e.dst}: ports disagree",
                               f"{e.src} is {list(a.shape)} {a.dtype}, {e.dst} is {list(b.shape)} {b.dtype}",
                               "make the shapes and dtypes equal (symbolic dims must match exactly)")
        if (dst, dp) in fed:
            raise InvalidInput(f"input {e.dst} is fed by two edges", f"from {fed[(dst, dp)]} and {e.src}",
                               "keep one")
        fed[(dst, dp)] = e.src
        if src == dst:
            raise InvalidInput(f"edge {e.src} -> {e.dst} loops on one node", "a walk is a path", "remove it")


def _check_walks(model: Model) -> None:
    edges = {(e.ends()[0][0], e.ends()[1][0]) for e in model.edges}
    on_walks = set()
    for w in model.walks:
        names = [n.name for n in model.nodes]
        for name in w.path:
            if name not in names:
                raise InvalidInput(f"walk '{w.name}' passes through unknown node '{name}'",
                                   f"nodes: {', '.join(names)}", "fix the path")
        if len(set(w.path)) != len(w.path):
            raise InvalidInput(f"walk '{w.name}' visits a node twice: {list(w.path)}", "a walk is a path",
                               "split it into two walks")
        # the path runs in order: every node but the last feeds a node after it, none feeds one before it
        # (a chain, or several encoders spliced into one LLM)
        for i, a in enumerate(w.path):
            back = [b for b in w.path[:i] if (a, b) in edges]
            if back:
                raise InvalidInput(f"walk '{w.name}' runs '{back[0]}' before '{a}', which feeds it",
                                   f"its path is {' -> '.join(w.path)}", f"put '{a}' before '{back[0]}'")
        for i, a in enumerate(w.path):
            later = w.path[i + 1:]
            if later and not any((a, b) in edges for b in later):
                raise InvalidInput(f"walk '{w.name}' runs '{a}' but no node after it on the path reads it: "
                                   "no edge between them", f"its path is {' -> '.join(w.path)}",
                                   f"declare an Edge from {a}.<out> to a later node's input, or drop '{a}' from the path")
        for key, what in ((w.axes, "axes"), (w.capture_limit, "capture_limit"), (w.ladders, "ladders")):
            for name in key:
                if name not in w.path:
                    raise InvalidInput(f"walk '{w.name}' sets {what} for '{name}', which is not on its path",
                                       f"path: {list(w.path)}", f"remove walks.{w.name}.{what}.{name}")
        sizes = walk_sizes(w)
        for name in w.path:
            node = model.node(name)
            axis = capture_axis(node, w)
            if axis not in sizes:
                raise InvalidInput(f"walk '{w.name}' does not budget '{axis}', the axis node '{name}' runs along",
                                   f"its budget: {w.budget.axes()}", f"add {axis}=<max per step> to its Budget")
            for p in fed_inputs(model, node, w):
                missing = node.inputs[p].axes() - set(sizes)
                if missing:
                    raise InvalidInput(f"walk '{w.name}': input {name}.{p} uses axis {sorted(missing)} the walk does not budget",
                                       f"its budget: {w.budget.axes()}", f"add {sorted(missing)[0]}=<max> to its Budget")
            limit = w.capture_limit.get(name)
            if limit is not None and limit < 0:
                raise InvalidInput(f"walk '{w.name}': capture_limit for '{name}' is {limit}", "it must be >= 0",
                                   "use 0 to run that node eagerly on this walk")
        on_walks |= set(w.path)
    stray = [n.name for n in model.nodes if n.name not in on_walks]
    if stray:
        raise InvalidInput(f"node(s) {stray} are on no walk", "nothing would ever run them",
                           "add them to a walk's path or remove them")


def _check_segments(model: Model) -> None:
    """A segments budget bounds an encoder's ragged attention segments: a walk with no such encoder would
    ignore it."""
    for w in model.walks:
        if w.budget.segments is None:
            continue
        counted = [n for n in w.path for res in model.node(n).resources.values()
                   if isinstance(spec := model.resource(res), RaggedAttentionSpec) and spec.rows_per_segment is None]
        if not counted:
            raise InvalidInput(f"walk '{w.name}' budgets segments={w.budget.segments}, but no node on its path has "
                               "ragged attention whose segments that counts (images or frame groups of one step)",
                               f"its path: {list(w.path)}", f"remove walks.{w.name}.budget.segments")


def _check_requests(model: Model) -> None:
    walks = [w.name for w in model.walks]
    for r in model.requests:
        for w in r.walks():
            if w not in walks:
                raise InvalidInput(f"request kind '{r.name}' uses unknown walk '{w}'",
                                   f"walks: {', '.join(walks)}", "declare the walk or fix the name")


def _check_resources(model: Model) -> None:
    used = {res for n in model.nodes for res in n.resources.values()}
    spaces = {r.name for r in model.resources if isinstance(r, WorkspaceSpec)}
    for r in model.resources:
        ws = getattr(r, "workspace", None)
        if ws is not None:
            if ws not in spaces:
                raise InvalidInput(f"resource '{r.name}' names workspace '{ws}', which is not a declared WorkspaceSpec",
                                   f"workspaces: {', '.join(sorted(spaces)) or '(none)'}", "declare it or fix the name")
            used.add(ws)
    unused = [r.name for r in model.resources if r.name not in used]
    if unused:
        raise InvalidInput(f"resource(s) {unused} are declared but nothing uses them",
                           "an unused resource would still hold memory", "bind them to a node or remove them")
