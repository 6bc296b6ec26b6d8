"""A model file: import it and call its declare(preset). Core: the compiler and the runtime both
read declarations through it."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from graphc.declare import Model
from graphc.errors import GraphcError, InvalidInput
from graphc.plan import file_sha256
from graphc.strict import explain_validation


@dataclass
class ModelSource:
    file: str
    preset: str
    model: Model
    module: object = None          # the imported model file (its host() serves the model)
    config: dict | None = None     # the checkpoint config.json the nodes were declared from

    @property
    def splits(self) -> bool:
        """Whether the model file declares tensor-parallel ranks (its declare() takes tp)."""
        import inspect

        try:
            return "tp" in inspect.signature(self.module.declare).parameters
        except (AttributeError, TypeError, ValueError):
            return False

    def split(self, tp: int) -> Model:
        """One tensor-parallel rank's declaration: declare(preset, config=..., tp=tp), each node's heads and MLP
        divided over tp ranks (graphc.StepContext.reduce sums their partial outputs). tp 1: the model as read."""
        if tp == 1:
            return self.model
        return _declare(self.module, Path(self.file), self.preset, self.config, tp).model

    def record(self) -> dict:
        out = {"name": self.model.name, "file": self.file, "sha256": file_sha256(self.file), "preset": self.preset}
        if self.config is not None:
            out |= {"config_sha256": config_sha256(self.config), "config": self.config}
        return out


def config_sha256(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def read_config(checkpoint: str | Path) -> dict:
    """A checkpoint folder's config.json."""
    path = Path(checkpoint) / "config.json"
    if not path.is_file():
        raise InvalidInput(f"{checkpoint} has no config.json", "the model's shapes are read from it",
                           "pass the folder a model was saved in (save_pretrained writes config.json)")
    try:
        data = json.loads(path.read_bytes())
    except OSError as e:
        raise InvalidInput(f"cannot read {path}", str(e), "check the checkpoint folder") from None
    except (ValueError, RecursionError) as e:     # not JSON, not UTF-8, a 4301-digit int, or nested too deep
        why = str(e).split(";")[0] if not isinstance(e, RecursionError) else "it nests deeper than a parser follows"
        raise InvalidInput(f"{path} is not JSON", why, "re-save the checkpoint") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path} holds {type(data).__name__}, not an object", "", "re-save the checkpoint")
    return data


def first_difference(a, b, at: str = "") -> str | None:
    """The first dotted key where two JSON values differ, with both values; None if equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            key = f"{at}.{k}" if at else k
            if k not in a or k not in b:
                return f"{key}: {'absent' if k not in a else repr(a[k])} in the plan, " \
                       f"{'absent' if k not in b else repr(b[k])} in the checkpoint"
            d = first_difference(a[k], b[k], key)
            if d:
                return d
        return None
    return None if a == b else f"{at or '(top)'}: {a!r} in the plan, {b!r} in the checkpoint"


def load_model(path: str, preset: str | None = None, config: dict | None = None, tp: int = 1) -> ModelSource:
    """Import a model file and call its declare(preset), or declare(preset, config=config) to declare
    the nodes from a checkpoint's config.json; with tp > 1, one tensor-parallel rank's part (ModelSource.split)."""
    p = Path(path)
    if not p.is_file():
        raise InvalidInput(f"model file {path} does not exist", "", "pass the path of a model .py file")
    name = "graphc_model_" + hashlib.sha256(str(p.resolve()).encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise InvalidInput(f"model file {path} is not a Python file", "graphc imports it to call its declare()",
                           "pass the path of a model .py file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod                   # as import does: dataclasses and pickle look a class's module up there
    try:
        spec.loader.exec_module(mod)
    except GraphcError:
        sys.modules.pop(name, None)
        raise
    except (Exception, SystemExit) as e:      # a model file that calls sys.exit() is refused like one that raises
        sys.modules.pop(name, None)
        raise InvalidInput(f"model file {path} failed to import", _raised(e, p), "fix the model file") from e
    src = _declare(mod, p, preset, config, tp)
    rel = os.path.relpath(p.resolve(), Path.cwd()) if p.resolve().is_relative_to(Path.cwd()) else str(p.resolve())
    return ModelSource(rel, src.preset, src.model, mod, config)


def _declare(mod, p: Path, preset: str | None, config: dict | None, tp: int) -> ModelSource:
    """Call an imported model file's declare(preset[, config=][, tp=]) and check what it returns."""
    path = str(p)
    declare = getattr(mod, "declare", None)
    if not callable(declare):
        raise InvalidInput(f"model file {path} has no declare() function",
                           "a model file defines declare(preset: str = ...) -> graphc.Model", "add it")
    import inspect

    try:
        params = inspect.signature(declare).parameters
    except (TypeError, ValueError):           # a callable without a signature (a builtin)
        raise InvalidInput(f"model file {path}: declare is {declare!r}, not a function",
                           "a model file defines declare(preset: str = ...) -> graphc.Model", "define it") from None
    kw = {}
    if config is not None:
        if "config" not in params:
            raise InvalidInput(f"{path} cannot declare a model from a checkpoint's config.json",
                               "its declare() takes no config argument", "plan it from a preset (no --checkpoint)")
        kw["config"] = config
    if tp != 1:
        if "tp" not in params:
            raise InvalidInput(f"{path} does not split its nodes over tensor-parallel ranks",
                               "its declare() takes no tp argument (declare(preset, tp=N) declares one rank's part)",
                               "plan one copy or replicas (--replicas), not --tp")
        kw["tp"] = tp
    args = (preset,) if preset is not None else ()
    called = f"declare({', '.join([*map(repr, args), *(f'tp={tp}' for _ in [tp] if tp != 1)])})"
    try:
        inspect.signature(declare).bind(*args, **kw)
    except TypeError as e:
        raise InvalidInput(f"{path}: declare() cannot be called as {called}", str(e),
                           "drop --preset if the model file has none" if args else
                           "give declare() a default preset: def declare(preset: str = ...)") from None
    try:
        model = declare(*args, **kw)
    except GraphcError:
        raise
    except (Exception, SystemExit) as e:
        raise _declare_failed(e, p, called, config is not None) from None
    if not isinstance(model, Model):
        raise InvalidInput(f"{path}: declare() returned {type(model).__name__}", "it must return a graphc.Model",
                           "return graphc.Model(name=..., nodes=[...], walks=[...]) from declare()")
    if preset is None:
        default = params["preset"].default if "preset" in params else inspect.Parameter.empty
        preset = "default" if default is inspect.Parameter.empty else default
    return ModelSource(path, str(preset), model, mod, config)


def _declare_failed(e: BaseException, path: Path, called: str, from_config: bool) -> InvalidInput:
    """Why a model file's declare() failed: a declaration type it built wrongly (which, and the line), the
    checkpoint's config.json it could not read, a preset it does not offer, or its own bug."""
    source = " from the checkpoint's config.json" if from_config else ""
    if isinstance(e, ValidationError):
        line = _line(e, path)
        at = f" (line {line})" if line else ""
        return explain_validation(e, f"the declaration in {path}{source}: its {e.title}{at}")
    if from_config:
        return InvalidInput(f"{path}: {called} cannot declare the model{source}", _raised(e, path),
                            "pass the checkpoint of a model this file declares, or plan a preset (no --checkpoint)")
    if isinstance(e, (ValueError, KeyError)):         # how model files refuse a preset they do not offer
        return InvalidInput(f"{path}: {called} failed", str(e).strip("'\""), "pick a preset the model file offers")
    return InvalidInput(f"{path}: {called} raised {type(e).__name__}", _raised(e, path), "fix the model file")


def _raised(e: BaseException, path: Path) -> str:
    """An exception a model file raised, with the line of that file it came from."""
    text = f"{type(e).__name__}: {e}"
    if isinstance(e, SyntaxError) and e.lineno is not None:
        return f"{text} (line {e.lineno})" if f"line {e.lineno}" not in text else text
    line = _line(e, path)
    return f"{text} (line {line} of {path})" if line else text


def _line(e: BaseException, path: Path) -> int | None:
    """The last line of the model file that the exception passed through."""
    import traceback

    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if _same_file(f.filename, path)]
    return lines[-1] if lines else None


def _same_file(filename: str, path: Path) -> bool:
    try:
        return Path(filename).resolve() == path.resolve()
    except (OSError, ValueError):
        return False
