"""Process-wide memo tables of the compiler. A memo may change how fast a plan is made, never what
it says: every key is the content of everything its value depends on (never an id(), which Python
reuses), and tests compare plans made with cold tables against plans made after other models.

The simulated step traces (what a plan spends most of its time on), the weight sizes of each node's
module, the allocator replays of the ledger, the kernel knobs each node's modules declare and the roles of
a module named by import path are also kept on disk (issue 14), so that a second `graphc plan` (another
--set, another GPU, another card count) computes only what changed, and imports no torch when nothing
did. A file's name is the sha256 of the table, the key, and the code fingerprint: the bytes of every
source and data file of graphc, models and resources as installed, of the file defining each module class
the key names (every file of its package for a module named by import path), and torch's installed version
(its meta kernels give the shapes). Any edit to any of them misses every entry, never reads a stale one.

    where     $GRAPHC_CACHE_DIR, else $XDG_CACHE_HOME/graphc, else ~/.cache/graphc; GRAPHC_CACHE_DIR=off
              turns it off
    safety    written to a temporary file and renamed into place (two plans at once each see a whole
              entry or none); an entry that does not read back (truncated, another version's) is a
              miss and is written again; the directory may be deleted at any time
    format    pickle, read back by an unpickler that builds only the cached values' types (Trace,
              WeightSizes, tuples, sets)
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import io
import os
import pickle
import sys
import tempfile
from pathlib import Path

from graphc.declare import ModuleRef

_TABLES: dict[str, dict] = {}
PERSISTENT = {"simulate_steps.traces", "size_weights", "tally_ledger.pools", "tally_ledger.general",
              "emit_plan.knobs", "verify.roles"}
_FINGERPRINTS: dict[tuple[str, ...], str] = {}


def table(name: str) -> dict:
    """The memo table of this name (one per use site)."""
    if name not in _TABLES:
        _TABLES[name] = DiskMemo(name) if name in PERSISTENT else {}
    return _TABLES[name]


def clear() -> None:
    """Empty every memo table: the next plan is made from nothing (in this process; the disk cache
    holds only what a cold run computes again, byte for byte)."""
    for t in _TABLES.values():
        t.clear()


def cache_dir() -> Path | None:
    """Where the disk memo lives, or None when it is turned off."""
    where = os.environ.get("GRAPHC_CACHE_DIR")
    if where is not None and where.strip().lower() in ("off", "0", "none", ""):
        return None
    if where:
        return Path(where)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "graphc"


def _sources() -> list[Path]:
    root = Path(__file__).resolve().parents[1]
    out = []
    for pkg in ("graphc", "models", "resources"):
        out += sorted(p for p in (root / pkg).rglob("*") if p.suffix in (".py", ".yaml", ".j2") and p.is_file())
    return out


def fingerprint(extra_files: tuple[str, ...] = ()) -> str:
    """The code a cached value may depend on (module docstring), as one digest."""
    if extra_files not in _FINGERPRINTS:
        h = hashlib.sha256(f"torch {torch_version()} python {sys.version_info[:2]}".encode())
        for p in _sources() + sorted({Path(f) for f in extra_files}):
            h.update(str(p.name).encode())
            try:
                h.update(p.read_bytes())
            except OSError:
                h.update(b"<unreadable>")
        _FINGERPRINTS[extra_files] = h.hexdigest()
    return _FINGERPRINTS[extra_files]


@functools.cache
def _package_files(top: str) -> tuple[str, ...]:
    """Every Python file of a top-level package (or the top-level module's own file), found without
    importing it (once a process: keys name their modules many times)."""
    spec = importlib.util.find_spec(top)
    if spec is None:
        return ()
    if not spec.submodule_search_locations:
        return (spec.origin,) if spec.origin else ()
    return tuple(str(p) for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.py"))


@functools.cache
def torch_version() -> str:
    """Installed torch's version, read without importing it."""
    return importlib.metadata.version("torch")


def _defining_files(key) -> tuple[str, ...]:
    """The source files of the module classes a key holds and of their bases (a model file's own
    classes among them: a model file is not in sys.modules, so by their functions' code objects); for a
    module named by import path (ModuleRef), every file of its top-level package, read without importing it."""
    files, stack = set(), [key]
    while stack:
        x = stack.pop()
        if isinstance(x, (tuple, list, frozenset, set)):
            stack.extend(x)
        elif isinstance(x, ModuleRef):
            files.update(_package_files(x.python_module.split(".")[0]))
        elif isinstance(x, type):
            for cls in x.__mro__:
                for v in vars(cls).values():
                    code = getattr(getattr(v, "__func__", v), "__code__", None)
                    if code is not None and not code.co_filename.startswith("<"):
                        files.add(code.co_filename)
    return tuple(sorted(files))


class _TraceUnpickler(pickle.Unpickler):
    ALLOWED = {("graphc.trace", "Trace"), ("graphc.trace", "_trace_from_events"),
               ("graphc.modules", "WeightSizes"), ("builtins", "frozenset"),
               ("builtins", "set"), ("builtins", "tuple")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not a cached trace's type")
        return super().find_class(module, name)


class DiskMemo(dict):
    """A memo table whose misses are looked up on disk, and whose new entries are written there."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.hits = self.misses = self.writes = 0

    def _path(self, key) -> Path | None:
        where = cache_dir()
        if where is None:
            return None
        text = repr(key)
        digest = hashlib.sha256(f"{self.name}\0{fingerprint(_defining_files(key))}\0{text}".encode()).hexdigest()
        return where / self.name / digest[:2] / f"{digest}.pkl"

    def __contains__(self, key) -> bool:
        if dict.__contains__(self, key):
            return True
        path = self._path(key)
        if path is None:
            return False
        try:
            value = _TraceUnpickler(io.BytesIO(path.read_bytes())).load()
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError, TypeError, IndexError):
            self.misses += 1
            return False
        self.hits += 1
        dict.__setitem__(self, key, value)
        return True

    def __setitem__(self, key, value) -> None:
        dict.__setitem__(self, key, value)
        path = self._path(key)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
            self.writes += 1
        except OSError:                   # a read-only or full disk: the plan goes on, uncached
            pass
