"""Strict pydantic base: unknown keys are refused with the closest valid key named."""
from __future__ import annotations

import difflib
import math
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from graphc.errors import InvalidInput


def closest(word: str, valid: list[str]) -> str | None:
    # str(): a YAML file's keys may be ints, dates or null
    match = difflib.get_close_matches(str(word), [str(v) for v in valid], n=1, cutoff=0.5)
    return match[0] if match else None


SHALLOW = 32


def _shallow(text: str) -> bool:
    """No line nested past SHALLOW levels (two spaces of indentation, or a block entry '- ', '? ' or ': '
    opened on the line, each a level), and no more than SHALLOW flow brackets open at once (brackets inside
    quoted strings counted too: a false alarm only takes the slower parser)."""
    depth = most = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            most = max(most, depth)
        elif ch in "]}":
            depth = max(depth - 1, 0)
    if most > SHALLOW:
        return False
    for line in text.splitlines():
        rest = line.lstrip(" ")
        level = (len(line) - len(rest)) // 2
        while rest[:2] in ("- ", "? ", ": ") or rest in ("-", "?", ":"):   # block entries opened on one line
            level += 1
            rest = rest[1:].lstrip(" ")
        if level > SHALLOW:
            return False
    return True


def read_yaml(source: Any, what: str, fix: str) -> Any:
    """yaml.safe_load, with every way it fails an InvalidInput naming `what`: besides YAMLError, PyYAML's
    constructors raise ValueError, KeyError, TypeError or AttributeError on scalars and tags they cannot
    convert ('!!int abc', '2020-13-45', an int of more than 4300 digits), and deep nesting RecursionError.
    A text that nests at most SHALLOW levels (brackets or indentation, counted generously) is parsed by libyaml
    where PyYAML has it (a plan reads several times faster); a deeper one by PyYAML's Python parser, which
    refuses what is too deep where libyaml's composer would overflow the C stack."""
    try:
        if isinstance(source, str) and _shallow(source) and hasattr(yaml, "CSafeLoader"):
            return yaml.load(source, Loader=yaml.CSafeLoader)
        return yaml.safe_load(source)
    except yaml.YAMLError as e:
        why = str(e)
    except RecursionError:
        why = "it nests deeper than a parser follows"
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as e:
        why = f"a value in it cannot be read: {type(e).__name__}: {str(e).split(';')[0]}"
    raise InvalidInput(f"{what} is not valid YAML", why, fix)


def unknown_key_message(key: str, valid: list[str], where: str) -> str:
    hint = closest(key, valid)
    suggestion = f"; did you mean '{hint}'?" if hint else ""
    return f"unknown key '{key}' in {where}{suggestion} (valid keys: {', '.join(sorted(valid))})"


MAX_INT = 2**63 - 1


def _past_int64(value: Any, where: str = "", depth: int = 0) -> tuple[str, int] | None:
    """The first int in a value (its lists, tuples and dicts, a few levels deep) past a signed 64-bit
    int, with where it is ('budget.seqs', 'ladder[2]')."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (where, value) if abs(value) > MAX_INT else None
    if depth < 4 and isinstance(value, (list, tuple, dict)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            at = f"{where}[{k}]" if not isinstance(value, dict) else f"{where}.{k}" if where else str(k)
            big = _past_int64(v, at, depth + 1)
            if big is not None:
                return big
    return None


MAX_COUNT = 65_536
COUNTS = {"layers", "depth", "heads", "experts"}


def _too_many(data: dict) -> tuple[str, Any] | None:
    """A count of layers, heads or experts (a key with one of COUNTS among its words) past MAX_COUNT: no
    model has that many, and building that many modules would not end before memory does."""
    for key, value in data.items():
        if COUNTS & set(str(key).split("_")) and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and value > MAX_COUNT:
            return str(key), value
    return None


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
            big = _past_int64(data)
            if big is not None:           # sizes reach torch and C code as 64-bit ints; refuse before they do
                where, n = big
                raise ValueError(f"{where} is about 2**{n.bit_length() - 1}, more than a 64-bit int holds (2**63 - 1)")
            many = _too_many(data)
            if many is not None:
                v = many[1]                       # an int, or a float that may be inf or have a fraction
                shown = f"{int(v):,}" if isinstance(v, int) or (math.isfinite(v) and v.is_integer()) else f"{v:,}"
                raise ValueError(f"{many[0]} is {shown}; a count of layers, heads or experts is at most "
                                 f"{MAX_COUNT:,} (building that many modules would not end)")
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
