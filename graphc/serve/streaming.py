"""Reading a request's events: server-sent events as the routes stream them, and a whole answer."""
from __future__ import annotations

import json

from graphc.runtime.engine import Event


def sse(obj: dict) -> str:
    """One server-sent event holding `obj` as JSON."""
    return f"data: {json.dumps(obj)}\n\n"


async def collect(events) -> list[Event]:
    """A request's events up to and including the one that finished it."""
    out = []
    while True:
        ev = await events.get()
        out.append(ev)
        if ev.finished:
            return out
