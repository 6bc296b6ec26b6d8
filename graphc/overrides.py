"""Overrides from --config FILE.yaml and --set KEY=VALUE, applied to a declaration strictly.

Shape: {walks: {W: {budget: {...}, ladder: [...], ladders: {node: [...]}, capture: bool, capture_limit: {node: n}, axes: {...}}},
        resources: {R: {<any field of R's spec but name>}}, nodes: {N: {device: i, dtype: ...}}}.
        media_cache: {encoder: rows}   (graphc/media_rows.py: checked and read by the compiler, not the model)
        lanes: {follow stage: bool}    (graphc/lanes.py: the same)
Unknown sections, names and keys are refused with the closest valid one named.
"""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from graphc.declare import Model
from graphc.errors import InvalidInput
from graphc.strict import closest, explain_validation, read_yaml

SECTIONS = {"walks": "walks", "resources": "resources", "nodes": "nodes"}
# settings of the plan's layout, not of the model: read by compile_model (`replicas`: --replicas, `tp`: --tp)
LAYOUT = {"replicas", "tp"}
# planning settings beside the model, checked and read by the passes (graphc/media_rows.py)
PLANNING = {"media_cache", "lanes"}
FIXED = {"walks": {"name", "kind", "path"}, "resources": {"name"},
         "nodes": {"name", "module", "config", "inputs", "outputs", "resources", "weight_prefix"}}


def parse_set(items: list[str]) -> dict:
    """['walks.prefill.budget.tokens=256', ...] -> nested dict; values are parsed as YAML scalars."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise InvalidInput(f"--set '{item}' has no '='", "each --set is KEY=VALUE",
                               "write it as e.g. --set walks.prefill.budget.tokens=256")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if any(not p for p in parts):
            raise InvalidInput(f"--set key '{key}' has an empty part", "keys are dotted paths",
                               "e.g. resources.kv.pages=176")
        value = read_yaml(raw, f"--set {key}: value '{raw[:80]}'", "quote it") if raw.strip() else None
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise InvalidInput(f"--set {key} conflicts with an earlier --set of '{p}'")
        node[parts[-1]] = value
    return out


def load_config(path: str) -> dict:
    try:
        with open(path, "rb") as f:          # bytes: YAML decodes them, and refuses what is not text
            raw = f.read()
    except OSError as e:
        raise InvalidInput(f"cannot read --config {path}", str(e), "check the path") from None
    data = read_yaml(raw, f"--config {path}", "fix the file") or {}
    if not isinstance(data, dict):
        raise InvalidInput(f"--config {path} must be a mapping at the top level",
                           f"it holds a {type(data).__name__}", "start the file with walks:, resources: or nodes:")
    return data


def merge(base: dict, top: dict) -> dict:
    """Deep merge; top wins."""
    out = dict(base)
    for k, v in top.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _refuse(kind: str, key: str, valid: list[str], where: str) -> InvalidInput:
    hint = closest(key, valid)
    return InvalidInput(f"unknown {kind} '{key}' in overrides at {where}",
                        f"valid {kind}s there: {', '.join(sorted(valid)) or '(none)'}",
                        f"use '{hint}'" if hint else "remove it")


def apply_overrides(model: Model, overrides: dict) -> Model:
    """A new Model with the overrides applied and every touched object re-validated."""
    if not overrides:
        return model
    if not isinstance(overrides, dict):
        raise InvalidInput("overrides must be a mapping", f"got {type(overrides).__name__}")
    updated = {}
    for section, entries in overrides.items():
        if section in LAYOUT | PLANNING:
            continue
        if section not in SECTIONS:
            raise _refuse("section", section, list(SECTIONS) + sorted(LAYOUT | PLANNING), "top level")
        if not isinstance(entries, dict):
            raise InvalidInput(f"overrides.{section} must map names to settings", f"got {entries!r}")
        items = {x.name: x for x in getattr(model, section)}
        for name, changes in entries.items():
            if name not in items:
                raise _refuse(section[:-1], name, list(items), section)
            if not isinstance(changes, dict):
                raise InvalidInput(f"overrides.{section}.{name} must be a mapping of keys to values",
                                   f"got {changes!r}", f"e.g. --set {section}.{name}.<key>=<value>")
            items[name] = _apply_one(items[name], changes, f"{section}.{name}", FIXED[section])
        updated[section] = tuple(items.values())
    try:
        return Model.model_validate({**model.__dict__, **updated})
    except ValidationError as e:
        raise explain_validation(e, "the overridden model") from None


def _apply_one(obj: Any, changes: dict, where: str, fixed: set[str]) -> Any:
    valid = [f for f in type(obj).model_fields if f not in fixed]
    for key in changes:
        if key not in valid:
            if key in fixed:
                raise InvalidInput(f"'{where}.{key}' cannot be overridden",
                                   f"{key} is part of the model's declaration, not a planning setting",
                                   f"change it in the model file; overridable here: {', '.join(valid)}")
            raise _refuse("key", key, valid, where)
    fields = dict(obj.__dict__)
    for key, value in changes.items():
        if key == "budget" and isinstance(value, dict):
            value = {**obj.budget.axes(), **value}
            value = {k: v for k, v in value.items() if v is not None}
        elif key in ("capture_limit", "axes", "ladders") and isinstance(value, dict):
            value = {**getattr(obj, key), **value}
        fields[key] = value
    try:
        return type(obj).model_validate(fields)
    except ValidationError as e:
        raise explain_validation(e, f"overrides at {where}") from None

