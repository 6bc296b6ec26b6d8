"""The compiler: a straight list of passes over a typed IR, verified between passes.

    verify_graph -> select_backends -> choose_buckets -> size_weights -> simulate_steps
    -> size_resources -> place_nodes -> check_fit -> [suggest_remedies] -> emit_plan (size_host per device)

On more than one device, compile_model runs them for each layout choose_layout offers (one copy over
the devices, a replica on each, or one copy split over tensor-parallel ranks) and keeps the layout that runs
the most requests at once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from graphc import lanes as stream_lanes, media_rows
from graphc.declare import Model
from graphc.errors import DoesNotFit
from graphc.overrides import apply_overrides
from graphc.errors import InvalidInput
from graphc.passes import choose_layout
from graphc.passes.check_fit import Fit, check_fit
from graphc.passes.choose_buckets import choose_buckets
from graphc.passes.emit_plan import emit_plan
from graphc.passes.place_nodes import Placement, place_nodes
from graphc.passes.select_backends import select_backends
from graphc.passes.simulate_steps import simulate_steps
from graphc.passes.size_resources import size_resources
from graphc.passes.size_weights import size_weights
from graphc.passes.suggest_remedies import Remedy, apply_trims, evaluate
from graphc.passes.tally_ledger import Sizing
from graphc.plan import Plan
from graphc.source import ModelSource
from graphc.targets import Target, get_target
from graphc.verify import verify_graph


@dataclass
class Result:
    sizing: Sizing
    placement: Placement
    fit: Fit
    timings: dict[str, float] = field(default_factory=dict)


def _timed(timings: dict, name: str, fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0
    return out


def run_passes(model: Model, target: Target, num_devices: int, headroom: int | None = None,
               media_cache: dict | None = None, lanes: dict | None = None) -> Result:
    """Every pass up to the fit decision; raises InvalidInput for a bad declaration. media_cache, lanes: the
    overrides' sections of those names (graphc/media_rows.py, graphc/lanes.py)."""
    t: dict[str, float] = {}
    ir = _timed(t, "verify_graph", verify_graph, model, target, num_devices)
    media = media_rows.settings(model, media_cache)
    lane_nodes = stream_lanes.lane_nodes(model, stream_lanes.settings(model, lanes))
    backends = _timed(t, "select_backends", select_backends, ir)
    ir.check()
    buckets = _timed(t, "choose_buckets", choose_buckets, ir)
    stream_lanes.check(ir, buckets, lane_nodes)
    weights = _timed(t, "size_weights", size_weights, ir)
    acts = _timed(t, "simulate_steps", simulate_steps, ir, buckets, backends)
    ir.check()
    sizes = _timed(t, "size_resources", size_resources, ir, backends, buckets)
    s = Sizing(ir, backends, buckets, weights, acts, sizes, headroom, media, lane_nodes)
    placement = _timed(t, "place_nodes", place_nodes, s)
    fit = _timed(t, "check_fit", check_fit, s, placement)
    ir.check()
    return Result(s, placement, fit, t)


@dataclass
class Compiled:
    plan: Plan | None
    result: Result
    remedies: list[Remedy]
    trimmed: list[Remedy]


def compile_model(source: ModelSource, gpu: str, num_devices: int = 1, overrides: dict | None = None,
                  fit: bool = False, memory_cap: int | None = None, headroom: int | None = None,
                  remedies: bool = True, replicas: int | None = None, tp: int | None = None) -> Compiled:
    """Plan a model for a target. Raises DoesNotFit (with ranked remedies) unless it fits or fit=True
    trims it until it does; raises InvalidInput for bad input. replicas, tp: force a layout (choose_layout);
    each is recorded as an override (`replicas`, `tp`), which forces it too."""
    overrides = dict(overrides or {})
    for key, value in (("replicas", replicas), ("tp", tp)):
        if value is not None:
            overrides[key] = value
        value = overrides.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise InvalidInput(f"{key}={value!r} is not a whole number",
                               "it counts copies of the model" if key == "replicas" else "it counts ranks",
                               f"pass --{key} 1 or --{key} {num_devices}")
    target = get_target(gpu, memory_cap, num_devices)

    def replan(ov: dict, layout: tuple[int, int] = (1, 1), num_devices: int = num_devices) -> Result:
        # the host's budget is split over every device of every replica and rank (cpu); each replica gets
        # num_devices/copies of them; a rank's declaration is planned on one device
        copies, ranks = layout
        return run_passes(apply_overrides(source.split(ranks), ov), get_target(gpu, memory_cap, num_devices),
                          num_devices // copies // ranks, headroom, ov.get(media_rows.SECTION),
                          ov.get(stream_lanes.SECTION))

    layout, result, why = _choose_layout(replan, overrides, num_devices, source.splits)
    planned = num_devices

    def retry(ov: dict, num_devices: int = num_devices) -> Result:      # remedies keep the layout
        same = layout.key if num_devices == planned else (1, 1)     # --gpus N+1: one copy over them
        return replan(ov, same, num_devices)

    trimmed: list[Remedy] = []
    if not result.fit.fits and fit:
        result, overrides, trimmed = apply_trims(result, overrides, retry)
    if not result.fit.fits:
        found = evaluate(result, overrides, retry) if remedies else []
        raise DoesNotFit(
            f"{source.model.name} does not fit {num_devices} x {target.name}:",
            "\n".join(f"  {p.text}" for p in result.fit.problems),
            _remedy_text(found) if found else "no single change found; try a larger --gpu or more --gpus",
            remedies=found, result=result)
    plan = emit_plan(result.sizing, result.placement, source.record(), overrides, trimmed,
                     replicas=layout.replicas, tp=layout.tp, layout_why=why)
    return Compiled(plan, result, [], trimmed)


def _choose_layout(replan, overrides: dict, num_devices: int, splits: bool):
    """Plan each layout choose_layout offers; the winner, its Result and why. A layout the model's pins
    rule out (a node pinned past one device) is left out of the choice, and said so."""
    forced, forced_tp = overrides.get("replicas"), overrides.get("tp")
    layouts, results, notes = [], {}, []
    for key in choose_layout.candidates(num_devices, forced, forced_tp, splits):
        try:
            results[key] = replan(overrides, key)
        except InvalidInput as e:
            if forced is not None or (forced_tp or 1) > 1 or key == (1, 1):
                raise
            notes.append(f"{_named(key)} ruled out: {e.what}")
            continue
        layouts.append(choose_layout.measure(results[key], *key))
    win, why = choose_layout.choose(layouts, forced is not None or (forced_tp or 1) > 1)
    if win.at_once == 0 and (1, 1) in results:          # nothing fits: refuse (and remedy) the single copy
        win = next(x for x in layouts if x.key == (1, 1))
    return win, results[win.key], "; ".join([why] + notes) if num_devices > 1 else ""


def _named(key: tuple[int, int]) -> str:
    replicas, tp = key
    return f"{tp} tensor-parallel ranks" if tp > 1 else f"{replicas} replicas"


def _remedy_text(remedies: list[Remedy]) -> str:
    from graphc.units import fmt_bytes

    lines = ["ranked remedies (each re-planned):"]
    for i, r in enumerate(remedies, 1):
        verdict = "fits" if r.fits else "helps"
        lines.append(f"  {i}. {r.change}  ({verdict}; frees {fmt_bytes(r.freed)}): {r.why}")
    lines.append("apply one with --set/--gpus, or pass --fit to apply the trims automatically")
    return "\n".join(lines)

