"""Process-wide memo tables of the compiler. A memo may change how fast a plan is made, never what
it says: every key is the content of everything its value depends on (never an id(), which Python
reuses), and tests compare plans made with cold tables against plans made after other models."""
from __future__ import annotations

_TABLES: dict[str, dict] = {}


def table(name: str) -> dict:
    """The memo table of this name (one per use site)."""
    return _TABLES.setdefault(name, {})


def clear() -> None:
    """Empty every memo table: the next plan is made from nothing."""
    for t in _TABLES.values():
        t.clear()
