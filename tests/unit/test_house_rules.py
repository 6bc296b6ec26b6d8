"""House rules for the code under graphc/, models/ and resources/ (tests aside):

    no import circles   among their modules, counting every import statement: at module level, inside a
                        function (a lazy import is still a dependency) and under `if TYPE_CHECKING`;
                        relative imports resolved; `import pkg` and `from pkg import name` (a name its
                        __init__ defines) count as an import of pkg/__init__.py, `from pkg import mod`
                        as one of pkg/mod.py; imports of outside packages are not edges
    no long functions   none over MAX_LINES lines, from its def line to its last line (ast's
                        end_lineno - lineno + 1), methods and nested functions included

Each rule carries one allowlist of the violations that other work is still removing. An entry that no
longer matches a violation fails the test too (remove it): the lists only shrink. The checks are
functions of the root and the package folders, and the last two tests plant a violation of each rule in a
temporary tree and see it found.
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("graphc", "models", "resources")
MAX_LINES = 60

# import circles still being broken elsewhere: each a strongly connected component's modules
KNOWN_CYCLES: set[frozenset[str]] = set()

# functions still being shortened elsewhere: "path:qualified name" -> the most lines each may have meanwhile
KNOWN_LONG: dict[str, int] = {}


# ---------------------------------------------------------------- the import graph

def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Every module under the package folders by its dotted name (a package by its __init__.py)."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The repo module `import name` runs last: the longest prefix of name that is one (None: outside)."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, mods: dict[str, Path]) -> set[str]:
    """The repo modules one import statement of `module` depends on."""
    if isinstance(node, ast.Import):
        return {m for m in (_resolve(a.name, mods) for a in node.names) if m}
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[:len(here) - (node.level - 1)]
        base = ".".join(here + ([node.module] if node.module else []))
    out = set()
    for a in node.names:
        sub = f"{base}.{a.name}"
        got = sub if sub in mods else _resolve(base, mods)     # a submodule, else the module that defines it
        if got:
            out.add(got)
    return out


def import_graph(root: Path, packages=PACKAGES) -> nx.DiGraph:
    """Module -> module for every import statement anywhere in a file; each edge's `at` lists the
    path:line of the statements that make it."""
    mods = module_files(root, packages)
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for module, path in mods.items():
        is_package = path.name == "__init__.py"
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for dep in _imported(node, module, is_package, mods) - {module}:
                    if not g.has_edge(module, dep):
                        g.add_edge(module, dep, at=[])
                    g.edges[module, dep]["at"].append(f"{rel}:{node.lineno}")
    return g


def import_cycles(root: Path, packages=PACKAGES) -> dict[frozenset[str], list[str]]:
    """Each strongly connected component of more than one module, with its circles spelled out: every
    simple cycle as `a -> b (path:line) -> ... -> a`."""
    g = import_graph(root, packages)
    out = {}
    for scc in nx.strongly_connected_components(g):
        if len(scc) < 2:
            continue
        sub = g.subgraph(scc)
        lines = []
        cycles = [c[c.index(min(c)):] + c[:c.index(min(c))] for c in nx.simple_cycles(sub)]   # from the least
        for cycle in sorted(cycles, key=lambda c: (len(c), c)):
            hops = zip(cycle, cycle[1:] + cycle[:1])
            lines.append(" -> ".join(f"{a} ({', '.join(g.edges[a, b]['at'])})" for a, b in hops) + f" -> {cycle[0]}")
        out[frozenset(scc)] = lines
    return out


# ---------------------------------------------------------------- function lengths

def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function, methods and nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                yield name, node
            yield from _functions(node, f"{name}.")
        else:
            yield from _functions(node, prefix)


def long_functions(root: Path, packages=PACKAGES, limit: int = MAX_LINES) -> dict[str, int]:
    """"path:qualified name" -> lines, of each function over `limit` lines (def line to last line)."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for name, node in _functions(ast.parse(path.read_text(), str(path))):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out[f"{rel}:{name}"] = max(n, out.get(f"{rel}:{name}", 0))
    return out


# ---------------------------------------------------------------- the rules

def test_no_import_circles():
    found = import_cycles(ROOT)
    new = {scc: lines for scc, lines in found.items() if scc not in KNOWN_CYCLES}
    gone = [sorted(scc) for scc in KNOWN_CYCLES if scc not in found]
    msg = [f"import circle among {', '.join(sorted(scc))}:\n  " + "\n  ".join(lines) for scc, lines in new.items()]
    msg += [f"KNOWN_CYCLES holds {scc}, which is no longer a circle as listed: remove it (or list what it is now)"
            for scc in gone]
    assert not msg, "\n".join(msg)


def test_no_function_over_the_limit():
    found = long_functions(ROOT)
    new = [f"{k} ({n} lines)" for k, n in sorted(found.items()) if k not in KNOWN_LONG]
    grew = [f"{k} ({found[k]} lines, allowed {n} meanwhile)" for k, n in KNOWN_LONG.items() if found.get(k, 0) > n]
    gone = [k for k in KNOWN_LONG if k not in found]
    msg = [f"over {MAX_LINES} lines: {x}" for x in new + grew]
    msg += [f"KNOWN_LONG holds {k}, which is {MAX_LINES} lines or fewer now (or gone): remove it" for k in gone]
    assert not msg, "\n".join(msg)


# ---------------------------------------------------------------- the checks find what is planted

def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_a_planted_import_circle_is_found(tmp_path):
    _write(tmp_path, {
        "graphc/__init__.py": "",
        "graphc/a.py": "import os\n\n\ndef f():\n    from graphc.b import g   # lazy: still a dependency\n",
        "graphc/b.py": "import torch\nfrom . import a\n",                     # relative: graphc.a
        "graphc/c.py": "from graphc import a\n",                              # into the circle, not part of it
        "models/__init__.py": "",
        "models/m.py": "import graphc.c\n",
        "resources/__init__.py": "from resources.r import R\n",             # a package and its module
        "resources/r.py": "from resources import R2\nR = 1\n",             # a name its __init__ defines
    })
    assert set(import_graph(tmp_path).edges) == {("graphc.a", "graphc.b"), ("graphc.b", "graphc.a"),
                                                 ("graphc.c", "graphc.a"), ("models.m", "graphc.c"),
                                                 ("resources", "resources.r"), ("resources.r", "resources")}
    found = import_cycles(tmp_path)
    assert set(found) == {frozenset({"graphc.a", "graphc.b"}), frozenset({"resources", "resources.r"})}, found
    assert found[frozenset({"graphc.a", "graphc.b"})] == [
        "graphc.a (graphc/a.py:5) -> graphc.b (graphc/b.py:2) -> graphc.a"]


def test_a_planted_long_function_is_found(tmp_path):
    lines = [f"x{i} = {i}\n" for i in range(60)]
    _write(tmp_path, {
        "graphc/__init__.py": "",
        "graphc/ok.py": "def at_the_limit():\n" + "".join("    " + x for x in lines[:59]),     # 60 lines
        "models/long.py": "class K:\n    def method(self):\n" + "".join("        " + x for x in lines)
                          + "\n\ndef outer():\n    def inner():\n" + "".join("        " + x for x in lines)
                          + "    return inner\n",
        "resources/__init__.py": "",
    })
    found = long_functions(tmp_path)
    assert found == {"models/long.py:K.method": 61, "models/long.py:outer": 63, "models/long.py:outer.inner": 61}, found
