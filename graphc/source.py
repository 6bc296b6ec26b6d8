"""A model file: import it and call its declare(preset). Core: the compiler and the runtime both
read declarations through it."""
from __future__ import annotations

import hashlib
import importlib.util
import os
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

    def record(self) -> dict:
        return {"name": self.model.name, "file": self.file, "sha256": file_sha256(self.file), "preset": self.preset}


def load_model(path: str, preset: str | None = None) -> ModelSource:
    """Import a model file and call its declare(preset)."""
    p = Path(path)
    if not p.is_file():
        raise InvalidInput(f"model file {path} does not exist", "", "pass the path of a model .py file")
    name = "graphc_model_" + hashlib.sha256(str(p.resolve()).encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(name, p)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except GraphcError:
        raise
    except Exception as e:
        raise InvalidInput(f"model file {path} failed to import", f"{type(e).__name__}: {e}",
                           "fix the model file") from e
    declare = getattr(mod, "declare", None)
    if not callable(declare):
        raise InvalidInput(f"model file {path} has no declare() function",
                           "a model file defines declare(preset: str = ...) -> graphc.Model", "add it")
    try:
        model = declare(preset) if preset is not None else declare()
    except ValidationError as e:
        raise explain_validation(e, f"the declaration in {path}") from None
    except (ValueError, KeyError) as e:
        raise InvalidInput(f"{path}: declare({preset!r}) failed", str(e).strip("'\""),
                           "pick a preset the model file offers") from None
    if not isinstance(model, Model):
        raise InvalidInput(f"{path}: declare() returned {type(model).__name__}", "it must return a graphc.Model")
    if preset is None:
        import inspect
        preset = inspect.signature(declare).parameters["preset"].default if "preset" in \
            inspect.signature(declare).parameters else "default"
    rel = os.path.relpath(p.resolve(), Path.cwd()) if p.resolve().is_relative_to(Path.cwd()) else str(p.resolve())
    return ModelSource(rel, str(preset), model)
