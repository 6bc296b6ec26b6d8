"""The leak oracle (issue 15): once an engine is idle, every KV page is free again and no request state
remains. Tests that abort, disconnect, fail or time out requests watch their engine with the
`leak_oracle` fixture (tests/conftest.py), which checks it when the test ends; `held(engine)` says what
an engine still holds, one line per thing, in words (empty: nothing)."""
from __future__ import annotations

import time


def held(engine) -> list[str]:
    out = []
    s = engine.scheduler
    if engine.requests:
        out.append(f"requests still registered: {sorted(engine.requests)[:5]}")
    if s.waiting or s.running:
        out.append(f"scheduler holds {len(s.waiting)} waiting and {len(s.running)} running requests")
    if s.pages.num_free != s.capacity:
        out.append(f"{s.capacity - s.pages.num_free} of {s.capacity} pages of the LLM stage not free")
    for res, slots in s.slots.items():
        if not slots.all_free():
            held_slots, usable = slots.num_slots - slots.reserved - slots.num_free, slots.num_slots - slots.reserved
            out.append(f"{held_slots} of {usable} {res} state slots not free")
    lane = getattr(engine, "speech", None)
    if engine.talking:
        out.append(f"{len(engine.talking)} speaking requests open")
    if lane is not None and lane.pages.num_free != lane.capacity:
        out.append(f"{lane.capacity - lane.pages.num_free} of {lane.capacity} pages of the follow stage not free")
    return out


def released(engine, timeout: float = 5.0) -> list[str]:
    """held(engine) once it is empty or `timeout` seconds have passed (a server frees what a dropped client
    held on its next step)."""
    t0 = time.monotonic()
    while True:
        left = held(engine)
        if not left or time.monotonic() - t0 > timeout:
            return left
        time.sleep(0.01)
