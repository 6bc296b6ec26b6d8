"""What changed between two plans, one line per difference.

Complete by construction: the whole plan body is walked, so a field added to the schema is diffed
without touching this file. Only `versions` is skipped: which torch/python compiled a plan changes
neither what the runtime does nor what the ledger says. Known places read as things ("node decoder
walk decode: budget 16 -> 8", "device 0 capture_pool: ... (+2.00 MiB)"), the rest as dotted paths."""
from __future__ import annotations

import json
from typing import Any

from graphc.plan import Plan
from graphc.units import fmt_bytes

IGNORED = ("versions",)
# Top-level collections whose keys name a thing, and the collections inside those things whose keys
# do too; a ledger key is already a component name, so it takes no noun.
THINGS = {"devices": "device", "nodes": "node", "resources": "resource", "walks": "walk",
          "requests": "request", "trimmed": "trim"}
INNER = {"buckets": "walk", "ledger": ""}
WIDE = 100   # a value or list wider than this (characters) is cut or summarized, so lines stay readable
SOME = 4     # list items named before "and N more"

Path = tuple[str | int, ...]


def diff_plans(a: Plan, b: Plan) -> list[str]:
    """One line per difference, in sorted key order; empty when the plans are equivalent."""
    return _diff((), _body(a), _body(b))


def _body(plan: Plan) -> dict:
    body = plan.body()
    for key in IGNORED:
        body.pop(key)
    return body


def _diff(path: Path, a: Any, b: Any) -> list[str]:
    if _key(a) == _key(b):     # not ==, which takes 1 for true and 1.0 for 1 (overrides hold any YAML)
        return []
    if isinstance(a, dict) and isinstance(b, dict) and not (a and b):      # emptied or filled: one line
        return [_line(path, f"removed {_brief(path, a)}" if a else f"added {_brief(path, b)}")]
    # devices and trims are records kept by position: compare them field by field, not as opaque items
    if isinstance(a, list) and isinstance(b, list) and all(isinstance(x, dict) for x in a + b):
        a, b = dict(enumerate(a)), dict(enumerate(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return [line for key in sorted(a.keys() | b.keys()) for line in _entry(path + (key,), a, b)]
    if isinstance(a, list) and isinstance(b, list):
        return [_line(path, _list_change(a, b))]
    return [_line(path, _value_change(path, a, b))]


def _entry(path: Path, a: dict, b: dict) -> list[str]:
    key = path[-1]
    if key not in b:
        return [_line(path, f"removed {_brief(path, a[key])}")]
    if key not in a:
        return [_line(path, f"added {_brief(path, b[key])}")]
    return _diff(path, a[key], b[key])


def _line(path: Path, change: str) -> str:
    subject, field = _where(path)
    if subject and field:
        return f"{subject}: {field} {change}"
    return f"{subject or field}: {change}"


def _where(path: Path) -> tuple[str, str]:
    """(thing, field): ('node decoder walk decode', 'budget'), ('device 0 capture_pool', ''), ('', 'target.gpu')."""
    subject, rest = [], list(path)
    for nouns in (THINGS, INNER):
        if len(rest) < 2 or rest[0] not in nouns:
            break
        subject.append(f"{nouns[rest[0]]} {rest[1]}".strip())
        rest = rest[2:]
    return " ".join(subject), ".".join(map(str, rest))


def _is_bytes(path: Path, *values: Any) -> bool:
    byte_field = str(path[-1]).endswith("bytes") or path[-2:-1] == ("ledger",)
    return byte_field and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _value_change(path: Path, x: Any, y: Any) -> str:
    if _is_bytes(path, x, y):
        return f"{fmt_bytes(x)} -> {fmt_bytes(y)} ({'+' if y > x else ''}{fmt_bytes(y - x)})"
    sx, sy = _show(x), _show(y)
    # long texts (sources, why, placement): start both a little before where they part
    at = next((i for i, (c, d) in enumerate(zip(sx, sy)) if c != d), min(len(sx), len(sy)))
    start = at - 20 if at > WIDE // 2 - 10 else 0
    return f"{_cut(sx, start)} -> {_cut(sy, start)}"


def _list_change(a: list, b: list) -> str:
    """Short lists whole; long ones (capture_order) as what was added, removed and moved."""
    if len(_show(a)) + len(_show(b)) <= WIDE:
        return f"{_show(a)} -> {_show(b)}"
    pos_a, pos_b = _positions(a), _positions(b)
    parts = []
    if added := [_show(b[i]) for k, i in pos_b.items() if k not in pos_a]:
        parts.append(f"added {_some(added)}")
    if removed := [_show(a[i]) for k, i in pos_a.items() if k not in pos_b]:
        parts.append(f"removed {_some(removed)}")
    # order is judged among the shared items only, so an insertion alone does not read as a move;
    # the farthest moves come first, so a single item moved across many reads first
    rank_b = {k: r for r, k in enumerate(k for k in pos_b if k in pos_a)}
    moved = [k for r, k in enumerate(k for k in pos_a if k in pos_b) if rank_b[k] != r]
    moved.sort(key=lambda k: (-abs(pos_a[k] - pos_b[k]), pos_a[k]))
    if moved:
        parts.append(f"order changed ({len(moved)} moved): "
                     + _some([f"{_show(a[pos_a[k]])} {pos_a[k]} -> {pos_b[k]}" for k in moved]))
    return "; ".join(parts)


def _positions(xs: list) -> dict[tuple[str, int], int]:
    """Each item's index, keyed by (item, occurrence) so repeated items stay distinct."""
    seen: dict[str, int] = {}
    out = {}
    for i, x in enumerate(xs):
        key = _key(x)
        seen[key] = seen.get(key, 0) + 1
        out[(key, seen[key])] = i
    return out


def _key(x: Any) -> str:
    return json.dumps(x, sort_keys=True)


def _some(items: list[str]) -> str:
    more = f" and {len(items) - SOME} more" if len(items) > SOME else ""
    return ", ".join(items[:SOME]) + more


def _brief(path: Path, v: Any) -> str:
    return fmt_bytes(v) if _is_bytes(path, v) else _cut(_show(v))


def _cut(s: str, start: int = 0) -> str:
    width = WIDE // 2
    return ("…" if start else "") + s[start:start + width] + ("…" if len(s) > start + width else "")


def _show(x: Any) -> str:
    if isinstance(x, str):
        return x or '""'
    if isinstance(x, list):
        return "[" + ", ".join(map(_show, x)) + "]"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in sorted(x.items())) + "}"
    return json.dumps(x)
