"""A model file: import it and call its declare(preset). Core: the compiler and the runtime both
read declarations through it."""
from __future__ import annotations

import hashlib
import importlib.util
import json
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
    module: object = None          # the imported model file (its host() serves the model)
    config: dict | None = None     # the checkpoint config.json the nodes were declared from

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
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InvalidInput(f"{path} is not JSON", str(e), "re-save the checkpoint") from None
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


def load_model(path: str, preset: str | None = None, config: dict | None = None) -> ModelSource:
    """Import a model file and call its declare(preset), or declare(preset, config=config) to declare
    the nodes from a checkpoint's config.json."""
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
    import inspect

    params = inspect.signature(declare).parameters
    kw = {}
    if config is not None:
        if "config" not in params:
            raise InvalidInput(f"{path} cannot declare a model from a checkpoint's config.json",
                               "its declare() takes no config argument", "plan it from a preset (no --checkpoint)")
        kw["config"] = config
    try:
        model = declare(preset, **kw) if preset is not None else declare(**kw)
    except ValidationError as e:
        raise explain_validation(e, f"the declaration in {path}") from None
    except (ValueError, KeyError) as e:
        raise InvalidInput(f"{path}: declare({preset!r}) failed", str(e).strip("'\""),
                           "pick a preset the model file offers") from None
    if not isinstance(model, Model):
        raise InvalidInput(f"{path}: declare() returned {type(model).__name__}", "it must return a graphc.Model")
    if preset is None:
        preset = params["preset"].default if "preset" in params else "default"
    rel = os.path.relpath(p.resolve(), Path.cwd()) if p.resolve().is_relative_to(Path.cwd()) else str(p.resolve())
    return ModelSource(rel, str(preset), model, mod, config)
