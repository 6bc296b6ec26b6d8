"""Choose how N devices serve a model: one copy of it with its nodes placed over the N devices, N replicas of
one device each (data parallel: requests are routed between whole copies, nothing crosses devices within a
step), or, where the model file declares tensor-parallel ranks (its declare() takes tp), one copy whose nodes
are each split over N ranks, one a device (their heads and MLP divided; every rank runs every step).

Each layout is planned in full (a tensor-parallel layout as one rank's declaration on one device: every rank
holds that ledger); the one that runs the most longest-allowed requests at once wins:

    at_once(layout) = replicas x min over its KV pools of min(pages / pages of the longest request,
                                                              the most sequences a decode walk of its users runs)

A replica that does not fit one device scores nothing. On a tie the fewer replicas win (one scheduler, no
routing), then the fewer weight bytes on the fullest device (a decode step reads them all: a split copy's
ranks read a part each). `--replicas R` or `--tp N` forces a layout and skips the choice.
"""
from __future__ import annotations

from dataclasses import dataclass

from graphc.errors import InvalidInput
from graphc.units import fmt_bytes


@dataclass(frozen=True)
class Layout:
    replicas: int
    devices: int            # per replica
    at_once: float          # longest-allowed requests all replicas run at once (0: it does not fit)
    detail: str             # what bounds it, for `why`
    tp: int                 # tensor-parallel ranks of the copy (each a device; `devices` counts them)
    weights: int            # weight bytes on the device that holds the most

    @property
    def key(self) -> tuple[int, int]:
        return self.replicas, self.tp


def candidates(num_devices: int, forced: int | None, forced_tp: int | None = None,
               splits: bool = False) -> list[tuple[int, int]]:
    """The (replicas, tensor-parallel ranks) layouts to plan: the forced one, else one copy and (on more than one
    device) a replica per device and, where the model declares ranks (`splits`), one copy split over every device.
    Replicas of several devices each, and ranks over some of the devices, are not offered: the runtime serves
    replicas of one device, and a copy split over all of the plan's devices."""
    if forced_tp is not None:
        if forced_tp not in (1, num_devices):
            raise InvalidInput(f"--tp {forced_tp} with --gpus {num_devices}",
                               "a tensor-parallel copy takes every device of the plan, one rank each",
                               f"pass --tp {num_devices} (or --tp 1: no split)")
        if forced_tp > 1:
            if forced not in (None, 1):
                raise InvalidInput(f"--tp {forced_tp} with --replicas {forced}",
                                   "a tensor-parallel copy takes every device: there is one copy",
                                   f"drop --replicas, or pass --tp 1 --replicas {forced}")
            return [(1, forced_tp)]
    if forced is None:
        offered = [(1, 1), (num_devices, 1)] if num_devices > 1 else [(1, 1)]
        return offered + ([(1, num_devices)] if num_devices > 1 and splits and forced_tp is None else [])
    if forced < 1 or num_devices % forced:
        raise InvalidInput(f"--replicas {forced} does not divide --gpus {num_devices}",
                           "each replica takes the same number of devices", f"pass --replicas 1 or {num_devices}")
    if forced not in (1, num_devices):
        raise InvalidInput(f"--replicas {forced} of {num_devices // forced} devices each",
                           "the runtime serves replicas of one device each, or one copy over all devices",
                           f"pass --replicas 1 or --replicas {num_devices}")
    return [(forced, 1)]


def measure(result, replicas: int, tp: int) -> Layout:
    """A planned layout's score: the longest requests it runs at once, and which pool bounds it."""
    s, placement = result.sizing, result.placement
    per = len(placement.devices) * tp
    weights = max(sum(i.bytes for i in d.items if i.component.startswith("weights.")) for d in placement.devices)
    if not result.fit.fits:
        return Layout(replicas, per, 0.0, "does not fit", tp, weights)
    pools = []                                # (what bounds it, and why) for each KV pool of the copy
    for d in placement.devices:
        for res, pages in d.kv_pages.items():
            held = pages / s.ir.model.resource(res).min_pages
            seqs = _decode_seqs(s, res)
            pools.append((min(held, seqs) if seqs else held,
                          f"{res} holds {held:.1f} longest requests" + (f", its decode walks run {seqs} at once"
                                                                          if seqs else "")))
    best, what = min(pools, default=(1.0, "no KV pool"))
    return Layout(replicas, per, replicas * best, what, tp, weights)


def _decode_seqs(s, res: str) -> int | None:
    """The most sequences a decode walk through a user of `res` runs in one step."""
    users = {n for n, _ in s.ir.users.get(res, [])}
    seqs = [w.budget.seqs for w in s.ir.model.walks
            if w.kind == "decode" and w.budget.seqs and users & set(w.path)]
    return max(seqs, default=None)


def choose(layouts: list[Layout], forced: bool) -> tuple[Layout, str]:
    """The winning layout and the sentence the plan records."""
    ranked = sorted(layouts, key=lambda x: (-x.at_once, x.replicas, x.weights, x.tp))
    win = ranked[0]
    if forced:
        flag = f"--tp {win.tp}" if win.tp > 1 else f"--replicas {win.replicas}"
        return win, f"{_name(win)} ({flag}): {_score(win)}"
    why = f"{_name(win)} chosen: {_score(win)}"
    for other in ranked[1:]:
        why += f"; {_name(other)}: {_score(other)}"
    return win, why + (" (the most longest-allowed requests at once wins; on a tie, fewer replicas, then fewer "
                       "weight bytes on the fullest device)")


def _name(x: Layout) -> str:
    if x.tp > 1:
        return f"one copy split over {x.tp} tensor-parallel ranks"
    if x.replicas == 1:
        return f"one copy over {x.devices} device{'s' if x.devices > 1 else ''}"
    return f"{x.replicas} replicas of one device each"


def _score(x: Layout) -> str:
    if x.at_once == 0:
        return x.detail
    each = f" ({x.at_once / x.replicas:.1f} each)" if x.replicas > 1 else ""
    per = f"; {fmt_bytes(x.weights)} of weights on each rank" if x.tp > 1 else ""
    return f"{x.at_once:.1f} longest requests at once{each}; {x.detail}{per}"
