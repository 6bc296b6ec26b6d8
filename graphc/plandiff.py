"""What changed between two plans: target, placement, ledgers, buckets, backends, pages."""
from __future__ import annotations

from graphc.plan import Plan
from graphc.units import fmt_bytes


def diff_plans(a: Plan, b: Plan) -> list[str]:
    out: list[str] = []
    if (a.model.name, a.model.preset, a.model.sha256) != (b.model.name, b.model.preset, b.model.sha256):
        out.append(f"model: {a.model.name}/{a.model.preset} ({a.model.sha256[:12]}) -> "
                   f"{b.model.name}/{b.model.preset} ({b.model.sha256[:12]})")
    for key in ("gpu", "count", "arch", "capacity_bytes"):
        if getattr(a.target, key) != getattr(b.target, key):
            out.append(f"target.{key}: {getattr(a.target, key)} -> {getattr(b.target, key)}")
    if a.overrides != b.overrides:
        out.append(f"overrides: {a.overrides} -> {b.overrides}")
    for name in sorted(set(a.nodes) | set(b.nodes)):
        na, nb = a.nodes.get(name), b.nodes.get(name)
        if na is None or nb is None:
            out.append(f"node {name}: {'added' if na is None else 'removed'}")
            continue
        if na.device != nb.device:
            out.append(f"node {name}: device {na.device} -> {nb.device}")
        if na.weights_bytes != nb.weights_bytes:
            out.append(f"node {name}: weights {fmt_bytes(na.weights_bytes)} -> {fmt_bytes(nb.weights_bytes)}")
        for walk in sorted(set(na.buckets) | set(nb.buckets)):
            ba, bb = na.buckets.get(walk), nb.buckets.get(walk)
            if ba is None or bb is None:
                out.append(f"node {name} walk {walk}: {'added' if ba is None else 'removed'}")
            elif (ba.budget, ba.captured, ba.eager_above) != (bb.budget, bb.captured, bb.eager_above):
                out.append(f"node {name} walk {walk}: budget {ba.budget} -> {bb.budget}, captured {ba.captured} -> "
                           f"{bb.captured}, eager above {ba.eager_above} -> {bb.eager_above}")
    for name in sorted(set(a.resources) | set(b.resources)):
        ra, rb = a.resources.get(name), b.resources.get(name)
        if ra is None or rb is None:
            out.append(f"resource {name}: {'added' if ra is None else 'removed'}")
            continue
        if ra.backend != rb.backend:
            out.append(f"resource {name}: backend {ra.backend} -> {rb.backend}")
        if ra.pages != rb.pages:
            out.append(f"resource {name}: pages {ra.pages} -> {rb.pages}")
        if ra.bytes != rb.bytes:
            out.append(f"resource {name}: {fmt_bytes(ra.bytes)} -> {fmt_bytes(rb.bytes)} ({fmt_bytes(rb.bytes - ra.bytes)})")
    for i in range(max(len(a.devices), len(b.devices))):
        da = a.devices[i] if i < len(a.devices) else None
        db = b.devices[i] if i < len(b.devices) else None
        if da is None or db is None:
            out.append(f"device {i}: {'added' if da is None else 'removed'}")
            continue
        for comp in sorted(set(da.ledger) | set(db.ledger)):
            x, y = da.ledger.get(comp, 0), db.ledger.get(comp, 0)
            if x != y:
                out.append(f"device {i} {comp}: {fmt_bytes(x)} -> {fmt_bytes(y)} ({'+' if y > x else ''}{fmt_bytes(y - x)})")
        if da.total_bytes != db.total_bytes:
            out.append(f"device {i} total: {fmt_bytes(da.total_bytes)} -> {fmt_bytes(db.total_bytes)}")
    for t in b.trimmed:
        if t not in a.trimmed:
            out.append(f"trimmed in B: {t.change}")
    return out
