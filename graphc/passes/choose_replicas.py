"""Choose how N devices serve a model: one copy of it split over the N devices, or N replicas of one device
each (data parallel: requests are routed between whole copies, nothing crosses devices within a step).

Each layout is planned in full; the one that runs the most longest-allowed requests at once wins:

    at_once(layout) = replicas x min over its KV pools of min(pages / pages of the longest request,
                                                              the most sequences a decode walk of its users runs)

A replica that does not fit one device scores nothing. On a tie the single copy wins (one scheduler, no
routing). `--replicas R` forces a layout and skips the choice.
"""
from __future__ import annotations

from dataclasses import dataclass

from graphc.errors import InvalidInput


@dataclass(frozen=True)
class Layout:
    replicas: int
    devices: int            # per replica
    at_once: float          # longest-allowed requests all replicas run at once (0: it does not fit)
    detail: str             # what bounds it, for `why`


def candidates(num_devices: int, forced: int | None) -> list[int]:
    """The replica counts to plan: the forced one, else 1 and (on more than one device) one per device.
    Replicas of several devices each are not offered: the runtime serves replicas of one device."""
    if forced is None:
        return [1, num_devices] if num_devices > 1 else [1]
    if forced < 1 or num_devices % forced:
        raise InvalidInput(f"--replicas {forced} does not divide --gpus {num_devices}",
                           "each replica takes the same number of devices", f"pass --replicas 1 or {num_devices}")
    if forced not in (1, num_devices):
        raise InvalidInput(f"--replicas {forced} of {num_devices // forced} devices each",
                           "the runtime serves replicas of one device each, or one copy over all devices",
                           f"pass --replicas 1 or --replicas {num_devices}")
    return [forced]


def measure(result, replicas: int) -> Layout:
    """A planned layout's score: the longest requests it runs at once, and which pool bounds it."""
    s, placement = result.sizing, result.placement
    per = len(placement.devices)
    if not result.fit.fits:
        return Layout(replicas, per, 0.0, "does not fit")
    pools = []                                # (what bounds it, and why) for each KV pool of the copy
    for d in placement.devices:
        for res, pages in d.kv_pages.items():
            held = pages / s.ir.model.resource(res).min_pages
            seqs = _decode_seqs(s, res)
            pools.append((min(held, seqs) if seqs else held,
                          f"{res} holds {held:.1f} longest requests" + (f", its decode walks run {seqs} at once"
                                                                          if seqs else "")))
    best, what = min(pools, default=(1.0, "no KV pool"))
    return Layout(replicas, per, replicas * best, what)


def _decode_seqs(s, res: str) -> int | None:
    """The most sequences a decode walk through a user of `res` runs in one step."""
    users = {n for n, _ in s.ir.users.get(res, [])}
    seqs = [w.budget.seqs for w in s.ir.model.walks
            if w.kind == "decode" and w.budget.seqs and users & set(w.path)]
    return max(seqs, default=None)


def choose(layouts: list[Layout], forced: bool) -> tuple[Layout, str]:
    """The winning layout and the sentence the plan records."""
    ranked = sorted(layouts, key=lambda x: (-x.at_once, x.replicas))
    win = ranked[0]
    if forced:
        return win, f"{_name(win)} (--replicas {win.replicas}): {_score(win)}"
    why = f"{_name(win)} chosen: {_score(win)}"
    for other in ranked[1:]:
        why += f"; {_name(other)}: {_score(other)}"
    return win, why + " (the most longest-allowed requests at once wins; a tie goes to one copy)"


def _name(x: Layout) -> str:
    if x.replicas == 1:
        return f"one copy over {x.devices} device{'s' if x.devices > 1 else ''}"
    return f"{x.replicas} replicas of one device each"


def _score(x: Layout) -> str:
    if x.at_once == 0:
        return x.detail
    each = f" ({x.at_once / x.replicas:.1f} each)" if x.replicas > 1 else ""
    return f"{x.at_once:.1f} longest requests at once{each}; {x.detail}"
