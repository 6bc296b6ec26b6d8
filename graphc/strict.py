"""Strict pydantic base: unknown keys are refused with the closest valid key named."""
from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from graphc.errors import InvalidInput


def closest(word: str, valid: list[str]) -> str | None:
    match = difflib.get_close_matches(word, valid, n=1, cutoff=0.5)
    return match[0] if match else None


def unknown_key_message(key: str, valid: list[str], where: str) -> str:
    hint = closest(key, valid)
    suggestion = f"; did you mean '{hint}'?" if hint else ""
    return f"unknown key '{key}' in {where}{suggestion} (valid keys: {', '.join(sorted(valid))})"


class Strict(BaseModel):
    """Every declaration and override type derives from this: frozen, no extra keys."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True,
                              protected_namespaces=())

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            valid = list(cls.model_fields)
            for key in data:
                if key not in cls.model_fields:
                    raise ValueError(unknown_key_message(str(key), valid, cls.__name__))
        return data


def explain_validation(err: ValidationError, where: str) -> InvalidInput:
    """A pydantic error as an InvalidInput that names each bad location."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"  {loc}: {msg}")
    return InvalidInput(f"{where} is invalid:", "\n".join(lines),
                        "correct the keys and values listed above")
