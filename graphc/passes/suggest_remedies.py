"""When a plan does not fit: concrete changes, each re-planned to measure the bytes it frees,
ranked (those that fit alone first, then by bytes freed). With --fit, apply trims greedily."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from graphc import media_rows
from graphc.errors import GraphcError
from graphc.overrides import merge
from graphc.passes.choose_buckets import rungs_for
from graphc.stages import slot_frames
from graphc.units import MiB, fmt_bytes, round_up
from resources.paged_kv import PagedKVSpec
from resources.workspace import WorkspaceSpec

ENCODER_AXES = ("windows", "patches", "frames")
MAX_SHOWN = 10


@dataclass(frozen=True)
class Remedy:
    change: str              # the --set form (or a flag)
    overrides: dict          # what it adds to the overrides ({} for a flag)
    flag: dict               # extra compile arguments (e.g. {'num_devices': 3})
    freed: int               # bytes freed on the devices that were over (re-planned)
    fits: bool               # whether this change alone makes the plan fit
    why: str
    trim: int | None         # --fit applies trims in this order (lower first); None: never automatic


def _set(path: str, value) -> dict:
    out: dict = {}
    node = out
    parts = path.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


# --fit's order: free wins first, then DESIGN.md's rule (the largest encoder rungs go first).
TRIM_WORKSPACE, TRIM_ENCODER_RUNGS, TRIM_FIXED_PAGES, TRIM_ENCODER_BUDGET, TRIM_SEQ_LEN = range(5)


def candidates(result) -> list[tuple[str, dict, dict, str, int | None]]:
    """(change, overrides, flags, why, trim order) worth re-planning for a failing result."""
    s, fit = result.sizing, result.fit
    bad = {p.device for p in fit.problems}
    on_bad = {n for n, d in result.placement.assignment.items() if d in bad}
    out = []
    for st in s.ir.steps:
        if st.node in on_bad:
            out += _capture_candidates(s, st) + _budget_candidates(s, st)
    for d in result.placement.devices:
        if d.index in bad:
            out += _pool_candidates(s, d) + _media_cache_candidates(s, d)
    out += _workspace_candidates(s)
    if s.ir.target.is_gpu and s.ir.num_devices < 8:
        n = s.ir.num_devices + 1
        out.append((f"--gpus {n}", {}, {"num_devices": n}, f"spread the nodes over {n} GPUs", None))
    seen, unique = set(), []
    for c in out:
        if c[0] not in seen:
            seen.add(c[0])
            unique.append(c)
    return unique


def _capture_candidates(s, st) -> list:
    """Capture a step's node up to a lower rung: the largest rung first (DESIGN.md), then half the ladder,
    then none at all."""
    rungs = s.buckets.walk_rungs[(st.node, st.walk)]
    cap = [r for r in rungs if r in s.buckets.captured.get((st.node, st.family), [])]
    if not cap or not s.ir.target.capture:
        return []
    out = []
    encoder = st.axis in ENCODER_AXES
    for lim in sorted({cap[-2] if len(cap) > 1 else 0, cap[(len(cap) - 1) // 2] if len(cap) > 2 else 0, 0},
                      reverse=True):
        what = f"up to {st.axis}={lim}; larger steps run eagerly" if lim else "not at all (eager steps)"
        out.append((f"walks.{st.walk}.capture_limit.{st.node}={lim}",
                    _set(f"walks.{st.walk}.capture_limit.{st.node}", lim), {},
                    f"capture {st.node} on {st.walk} {what}", TRIM_ENCODER_RUNGS if encoder else None))
    return out


def _budget_candidates(s, st) -> list:
    """Lower a walk's budget to a rung below it (the one under it, and half the ladder). A chunk walk's
    slots keep their frames (its stage cuts chunks of that length): it keeps fewer slots."""
    below = [r for r in rungs_for(st.budget, st.ladder) if r < st.budget]
    encoder = st.axis in ENCODER_AXES
    walk = s.ir.model.walk(st.walk)
    slot = slot_frames(walk.budget.axes()) if walk.kind == "chunk" else None
    out = []
    for new in sorted({below[-1], below[(len(below) - 1) // 2]} if below else set(), reverse=True):
        trim = TRIM_ENCODER_BUDGET if encoder else None
        if slot and new % slot == 0:
            seqs = new // slot
            out.append((f"walks.{st.walk}.budget={{{st.axis}: {new}, seqs: {seqs}}}",
                        _set(f"walks.{st.walk}.budget", {st.axis: new, "seqs": seqs}), {},
                        f"lower {st.walk}'s slots from {walk.budget.seqs} to {seqs} ({slot} {st.axis} "
                        f"each); fewer chunks run in one step", trim))
        elif not slot:
            out.append((f"walks.{st.walk}.budget.{st.axis}={new}", _set(f"walks.{st.walk}.budget.{st.axis}", new), {},
                        f"lower {st.walk}'s {st.axis} budget from {st.budget} to {new}"
                        + ("; larger inputs are refused" if encoder else "; steps are cut smaller")
                        + _state_note(s, st.walk, st.axis, new), trim))
    return out


def _state_note(s, walk: str, axis: str, new: int) -> str:
    """What fewer streams free in the linear_state slots that this walk's seqs budget sizes."""
    notes = [f"{st.streams - new} fewer {res} slots, -{fmt_bytes((st.streams - new) * s.ir.model.resource(res).slot_bytes)}"
             " of state" for res, st in s.resources.state.items()
             if axis == "seqs" and st.walk == walk and s.ir.model.resource(res).slots is None]   # new: a rung below
    return "; fewer streams: " + ", ".join(notes) if notes else ""


def _media_cache_candidates(s, d) -> list:
    """No row cache on an over-full device: repeated media is encoded again, or a speaking request computes the
    LLM rows its follow stage reads again (graphc/media_rows.py)."""
    llm, out = media_rows.llm_of(s.ir.model), []
    for comp in d.items:
        if comp.component.startswith(media_rows.SECTION + ".") and comp.bytes:
            node = comp.component.split(".", 1)[1]
            cost = ("repeated media is encoded again" if node != llm else
                    "a speaking request computes the rows its follow stage reads again, and the prompt after them")
            out.append((f"{media_rows.SECTION}.{node}=0", _set(comp.component, 0), {},
                        f"no cache of {node}'s output rows ({fmt_bytes(comp.bytes)}); {cost}", None))
    return out


def _pool_candidates(s, d) -> list:
    """Smaller fixed KV pools on an over-full device, a pool grown to what its longest request needs, or
    shorter requests where a pool cannot hold the longest."""
    over = max(0, -d.free)
    out = []
    for res, pages in d.kv_pages.items():
        spec = s.ir.model.resource(res)
        if spec.pages is not None:
            new = max(spec.min_pages, pages - -(-over // spec.page_bytes))
            if new < pages:
                out.append((f"resources.{res}.pages={new}", _set(f"resources.{res}.pages", new), {},
                            f"shrink fixed pool {res} from {pages} to {new} pages", TRIM_FIXED_PAGES))
        if spec.pages is not None and spec.pages < spec.min_pages:
            out.append((f"resources.{res}.pages={spec.min_pages}", _set(f"resources.{res}.pages", spec.min_pages),
                        {}, f"grow fixed pool {res} to the {spec.min_pages} pages the longest request needs", None))
        if pages < spec.min_pages and pages > 0:
            tokens = pages * spec.page_size
            out.append((f"resources.{res}.max_seq_len={tokens}", _set(f"resources.{res}.max_seq_len", tokens), {},
                        f"allow requests up to {tokens:,} tokens in {res} (from {spec.max_seq_len:,})", TRIM_SEQ_LEN))
    return out


def _workspace_candidates(s) -> list:
    """Declared workspaces sized by the compiler to their need, or kept in one slot."""
    out = []
    for ws in s.resources.workspaces.values():
        spec = s.ir.model.resource(ws.name)
        if ws.declared and isinstance(spec, WorkspaceSpec):
            need = round_up(ws.need.bytes, MiB)
            if need < spec.bytes:
                out.append((f"resources.{ws.name}.bytes=null", _set(f"resources.{ws.name}.bytes", None), {},
                            f"let the compiler size workspace {ws.name} to its need, {fmt_bytes(need)} instead of"
                            f" {fmt_bytes(spec.bytes)} ({ws.need.formula})", TRIM_WORKSPACE))
        if isinstance(spec, WorkspaceSpec) and spec.slots > 1:
            out.append((f"resources.{ws.name}.slots=1", _set(f"resources.{ws.name}.slots", 1), {},
                        f"keep one slot of workspace {ws.name} instead of {spec.slots}", TRIM_WORKSPACE))
    return out


def _over(result) -> int:
    return sum(max(0, -d.free) for d in result.placement.devices)


def _kv_short(result) -> int:
    return sum(1 for p in result.fit.problems if p.over_bytes == 0)


def _held(result, devices: set[int]) -> int:
    """What these devices hold besides their fill KV pools, which take whatever is left: a remedy
    that frees memory on a device whose fill pool is short shows as more pages, not a smaller total."""
    fill = {r.name for r in result.sizing.ir.model.resources if isinstance(r, PagedKVSpec) and r.pages is None}
    return sum(d.total - sum(d.get(f"kv.{name}") for name in fill) for d in result.placement.devices
               if d.index in devices)


def evaluate(result, overrides: dict, replan: Callable) -> list[Remedy]:
    """Re-plan each candidate and measure it."""
    bad = {p.device for p in result.fit.problems}
    remedies = []
    for change, extra, flags, why, trim in candidates(result):
        try:
            new = replan(merge(overrides, extra), **flags)
        except GraphcError:
            continue
        if flags:
            freed = _over(result) - _over(new)
        else:
            freed = _held(result, bad) - _held(new, bad)
        improves = _over(new) < _over(result) or _kv_short(new) < _kv_short(result)
        if new.fit.fits or improves:
            remedies.append(Remedy(change, extra, flags, freed, new.fit.fits, why, trim))
    remedies.sort(key=lambda r: (not r.fits, -r.freed))
    return remedies[:MAX_SHOWN]


def apply_trims(result, overrides: dict, replan: Callable, max_steps: int = 24):
    """--fit: take the trim that frees the most, re-plan, repeat until the plan fits."""
    trimmed = []
    for _ in range(max_steps):
        if result.fit.fits:
            break
        options = [r for r in evaluate(result, overrides, replan) if r.trim is not None]
        if not options:
            break
        best = min(options, key=lambda r: (r.trim, not r.fits, -r.freed))
        overrides = merge(overrides, best.overrides)
        result = replan(overrides)
        trimmed.append(best)
    return result, overrides, trimmed
