"""graphc diff reports every difference between two plans except `versions`, once, naming the field.

The property test takes shipped plans and changes one thing at a time (every leaf, every list's order
and length, every dict key that the schema lets come or go), so a field the diff forgets fails here."""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import NamedTuple

import pytest
from pydantic import ValidationError

from graphc.plan import Plan, load_plan
from graphc.plandiff import diff_plans
from tests.conftest import ROOT

# one small plan, one with two devices, one with trims and overrides
PLANS = ["tiny_h100.plan", "omni_2gpu.plan", "qwen3_omni_h100_seed80gb_fit.plan"]
# collection names the diff spells as nouns ("node decoder walk decode"), so a line need not repeat them
NOUNS = {"devices", "nodes", "resources", "walks", "requests", "trimmed", "buckets", "ledger"}
TRIM = {"change": "x", "freed_bytes": 1, "why": "x"}
# pipeline fields the schema closes: a stage's kind and media are fixed sets, and a stage's name and
# `after` refer to each other and to the walks, so one leaf edited alone may have no valid variant
PIPELINE_CLOSED = {"kind", "name", "after", "media"}

Path = tuple


@pytest.fixture(scope="module", params=PLANS)
def plan(request) -> Plan:
    return load_plan(ROOT / "plans" / request.param)


def _nodes(x, path: Path = ()) -> Iterator[tuple[Path, object]]:
    """Every container and leaf of a JSON-shaped tree, with its path."""
    yield path, x
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for key, value in items:
        yield from _nodes(value, path + (key,))


def _is_leaf(x) -> bool:
    return not isinstance(x, (dict, list)) or not x


def _variants(x) -> list:
    """Values of the same type unlike x; for a null or an empty container, candidates the schema picks from."""
    if isinstance(x, bool):
        return [not x]
    if isinstance(x, (int, float)):
        return [x + 1]
    if isinstance(x, str):
        return [x + "x"]
    if x == []:
        return [["x"], [1], [TRIM]]
    return [1, "x", {"1": 1}, {"x": 1}]      # None or {}


def _rebuilt(body: dict, path: Path, edit: Callable) -> Plan | None:
    """The plan with edit applied to the container at path[:-1]; None when the schema refuses it."""
    body = copy.deepcopy(body)
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    edit(parent, path[-1])
    try:
        return Plan.model_validate({**body, "fingerprint": "x"})
    except ValidationError:
        return None


class Change(NamedTuple):
    path: Path                   # where the edit lands
    edits: list[Callable]        # candidates, (container, key) -> None; the first the schema accepts is used
    required: bool = True        # one candidate must be accepted (False where the schema may forbid it)
    one_line: bool = True        # one change, one line (a swap of two records changes many fields)
    shows: tuple[str, ...] = ()  # items the line must show: what was swapped or removed


def _check(base: Plan, changed: Plan, change: Change) -> str | None:
    """Why the diff of one change is wrong, or None when one line names the field and shows the items."""
    lines = diff_plans(base, changed)
    if not lines:
        return f"{change.path}: no difference reported"
    if change.one_line and len(lines) != 1:
        return f"{change.path}: {len(lines)} lines for one change: {lines}"
    named = [k for k in change.path if isinstance(k, str) and k not in NOUNS]
    if missing := [k for k in named + list(change.shows) if k not in lines[0]]:
        return f"{change.path}: {lines[0]!r} does not name {missing}"
    return None


def _set(value):
    return lambda p, k: p.__setitem__(k, copy.deepcopy(value))


def _swap(i: int, j: int):
    def edit(p, k) -> None:
        p[k][i], p[k][j] = p[k][j], p[k][i]
    return edit


def _copy_sibling(p, k) -> None:
    p[k] = copy.deepcopy(next(iter(p.values())))


def _plain(*items) -> tuple[str, ...]:
    """The items a line can be asked to show verbatim: strings and numbers."""
    return tuple(str(v) for v in items if not isinstance(v, (dict, list)))


def _changes(body: dict) -> Iterator[Change]:
    """Every leaf changes value; every list swaps two unlike items and loses one; every dict loses and
    gains a key wherever the schema allows it."""
    for path, x in _nodes(body):
        if not path or path[0] == "versions":
            continue
        if _is_leaf(x):
            closed = path[0] == "pipeline" and PIPELINE_CLOSED & {k for k in path if isinstance(k, str)}
            yield Change(path, [_set(v) for v in _variants(x)], required=not closed)
        if isinstance(x, list) and x:
            records = isinstance(x[0], dict)
            if j := next((i for i, v in enumerate(x) if v != x[0]), 0):
                yield Change(path, [_swap(0, j)], one_line=not records, shows=_plain(x[0], x[j]))
            if not records:
                mid = len(x) // 2
                yield Change(path, [lambda p, k, mid=mid: p[k].pop(mid)], required=False, shows=_plain(x[mid]))
        if isinstance(x, dict) and x:
            for key in x:
                yield Change(path + (key,), [lambda p, k: p.pop(k)], required=False)
            for new in ("zz", "7"):
                yield Change(path + (new,), [_copy_sibling], required=False)


def test_every_field_except_versions_is_diffed(plan):
    body, problems, checked = plan.body(), [], 0
    for change in _changes(body):
        edited = (_rebuilt(body, change.path, e) for e in change.edits)
        changed = next((p for p in edited if p is not None and p.body() != body), None)
        if changed is None:
            problems += [f"{change.path}: no valid change found"] if change.required else []
            continue
        checked += 1
        problems += filter(None, [_check(plan, changed, change)])
    assert checked > 300 and not problems, f"{len(problems)} problems, first: " + "\n".join(problems[:10])


def test_versions_and_the_plan_itself_are_equivalent(plan):
    assert diff_plans(plan, plan) == []
    body = plan.body()
    for path, x in _nodes(body["versions"], ("versions",)):
        if _is_leaf(x):
            changed = _rebuilt(body, path, lambda p, k: p.__setitem__(k, x + "x"))
            assert changed.body() != body and diff_plans(plan, changed) == []
    torch_less = _rebuilt(body, ("versions", "torch"), lambda p, k: p.pop(k))
    assert diff_plans(plan, torch_less) == []


def _tiny_edited(edit: Callable[[dict], None]) -> tuple[Plan, Plan]:
    """plans/tiny_h100.plan and a copy with edit applied to its body."""
    plan = load_plan(ROOT / "plans" / "tiny_h100.plan")
    body = plan.body()
    edit(body)
    return plan, Plan.model_validate({**body, "fingerprint": "x"})


def test_swapped_capture_order_names_both_graphs():
    def swap(body: dict) -> None:
        order = body["devices"][0]["capture_order"]
        order[14], order[20] = order[20], order[14]
    a, b = _tiny_edited(swap)
    order = a.devices[0].capture_order              # the two graphs swapped, whichever the plan holds there
    assert diff_plans(a, b) == [
        f"device 0: capture_order order changed (2 moved): {order[14]} 14 -> 20, {order[20]} 20 -> 14"]


def test_readable_lines_for_ledger_nodes_buckets_resources_and_trims():
    def edit(body: dict) -> None:
        body["devices"][0]["ledger"]["capture_pool"] += 2 << 20
        body["nodes"]["decoder"]["device"] = 1
        body["nodes"]["decoder"]["buckets"]["decode"]["budget"] = 8
        body["resources"]["decoder_kv"]["backend"] = "fa2"
        body["resources"]["decoder_kv"]["pages"] = {"0": 512}
        body["trimmed"] = [TRIM]
    a, b = _tiny_edited(edit)
    assert diff_plans(a, b) == [
        "device 0 capture_pool: 34.00 MiB -> 36.00 MiB (+2.00 MiB)",
        "node decoder walk decode: budget 16 -> 8",
        "node decoder: device 0 -> 1",
        "resource decoder_kv: backend fa3 -> fa2",
        "resource decoder_kv: pages.0 256 -> 512",
        "trim 0: added {change: x, freed_bytes: 1, why: x}",
    ]
    assert diff_plans(b, a)[-1] == "trim 0: removed {change: x, freed_bytes: 1, why: x}"
