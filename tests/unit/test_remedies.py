"""Remedies for a plan that does not fit (graphc/passes/suggest_remedies.py), on small models built
so that each remedy is decisive (modules in tests/remedies_model.py).

What is expected, from docs/design-notes.md ("Refusals and remedies") and DESIGN.md ("Buckets"):
- candidates, for the nodes and devices that are over: capture less of a walk (the largest captured
  rung goes first, then half the captured ladder, then none), lower a budget (to the rung below it
  and to the middle of the rungs below), shrink a fixed KV pool by the pages the device is over
  (never below what the longest request needs), grow a pool that is too short or allow shorter
  requests, let the compiler size a declared workspace (bytes=null) or keep one slot, add a GPU;
- each is re-planned and reports the bytes it frees on the devices that were over; only those
  that fit or help are shown, those that fit alone first, then by bytes freed, at most ten;
- --fit applies trims only, in this order: declared workspaces, encoder rungs, fixed pools,
  encoder budgets, request length; each is recorded under `trimmed`.

The freed bytes are computed by hand on the cpu target (whose ledger is the plain sum of weights,
pools, workspaces and the largest eager step's live bytes), and on GPU targets from the ledgers of
independently compiled plans (the totals of the devices that were over, before and after).
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import graphc as gc
from graphc.overrides import apply_overrides, merge
from graphc.pipeline import compile_model, run_passes
from graphc.source import ModelSource
from graphc.targets import get_target
from graphc.units import MiB
from resources import PagedKVSpec, RaggedAttentionSpec, WorkspaceSpec
from tests.remedies_model import Enc2, Quad, blob_node, dec_node, enc_node

MODEL_FILE = str(Path(__file__).resolve().parents[1] / "remedies_model.py")

TRIM_WORKSPACE, TRIM_ENCODER_RUNGS, TRIM_FIXED_PAGES, TRIM_ENCODER_BUDGET, TRIM_SEQ_LEN = range(5)


def planner(model: gc.Model, gpu: str, cap: int | None = None, num_devices: int = 1):
    """The replan callback compile_model hands the remedy search (no headroom, so a cap is exact)."""
    target = get_target(gpu, cap)

    def replan(overrides: dict, num_devices: int = num_devices):
        return run_passes(apply_overrides(model, overrides), target, num_devices, 0)
    return replan


def totals(result, devices) -> int:
    return sum(d.total for d in result.placement.devices if d.index in devices)


def bad_devices(result) -> set[int]:
    return {p.device for p in result.fit.problems}


# ------------------------------------------------------------------ GPU: every kind of candidate

# a KV page: K and V x 8 layers x 64 tokens x 8 kv heads x 128 dims x 2 B = 2 MiB, a multiple of the
# caching allocator's 2 MiB rounding, so a pool of n pages holds exactly n x 2 MiB
BIG_PAGE = 2 * 8 * 64 * 8 * 128 * 2
assert BIG_PAGE == 2 * MiB


BIG_KV = (8, 128)              # big_pool's key heads and head dim, as the decoder node calls it


def big_pool(name: str, pages: int | None, max_seq_len: int = 4096, **kw) -> PagedKVSpec:
    return PagedKVSpec(name=name, num_layers=8, num_qo_heads=8, num_kv_heads=8, head_dim=128, page_size=64,
                       max_seq_len=max_seq_len, pages=pages, **kw)     # 4096 tokens: 64 pages


def ragged(name: str, workspace: str | None = None, backend: str = "fa2") -> RaggedAttentionSpec:
    return RaggedAttentionSpec(name=name, num_heads=2, head_dim=64, max_segment=16, rows_per_segment=16,
                               backend=backend, workspace=workspace)


def gpu_model() -> gc.Model:
    """An encoder (windows) and a decoder (tokens, one fixed 100-page pool) on one GPU."""
    return gc.Model(
        name="remedies-gpu",
        nodes=[enc_node(), dec_node(kv=BIG_KV)],
        resources=[WorkspaceSpec(name="ws", bytes=64 * MiB, slots=2), ragged("attn", "ws"), big_pool("kv", 100)],
        walks=[
            # rungs 1 2 4 8 16 32, captured up to 16; 32 runs eagerly
            gc.Walk(name="wide", kind="prefill", path=("enc",), ladder=(1, 2, 4, 8, 16), capture_limit={"enc": 16},
                    budget=gc.Budget(windows=32)),
            gc.Walk(name="pair", kind="prefill", path=("enc",), ladder=(4,), budget=gc.Budget(windows=8)),  # 4 8
            gc.Walk(name="one", kind="prefill", path=("enc",), ladder=(4,), budget=gc.Budget(windows=4)),   # 4
            gc.Walk(name="prefill", kind="prefill", path=("dec",), ladder=(16, 64),
                    budget=gc.Budget(tokens=128, seqs=4)),                                           # 16 64 128
            gc.Walk(name="decode", kind="decode", path=("dec",), capture=False, budget=gc.Budget(seqs=8)),  # 1 2 4 8
        ])


GPU_CANDIDATES = [
    # wide captures [1, 2, 4, 8, 16]: drop its largest rung (up to 8), keep half (up to 4), none
    ("walks.wide.capture_limit.enc=8", TRIM_ENCODER_RUNGS),
    ("walks.wide.capture_limit.enc=4", TRIM_ENCODER_RUNGS),
    ("walks.wide.capture_limit.enc=0", TRIM_ENCODER_RUNGS),
    # the rungs below its budget 32 are [1, 2, 4, 8, 16]: the next one down, and the middle one
    ("walks.wide.budget.windows=16", TRIM_ENCODER_BUDGET),
    ("walks.wide.budget.windows=4", TRIM_ENCODER_BUDGET),
    # pair captures [4, 8]: without 8, or none; below 8 there is only 4
    ("walks.pair.capture_limit.enc=4", TRIM_ENCODER_RUNGS),
    ("walks.pair.capture_limit.enc=0", TRIM_ENCODER_RUNGS),
    ("walks.pair.budget.windows=4", TRIM_ENCODER_BUDGET),
    # one captures [4] only: none at all; nothing lies below its budget
    ("walks.one.capture_limit.enc=0", TRIM_ENCODER_RUNGS),
    # the decoder's axes are no encoder's: never trimmed automatically
    ("walks.prefill.capture_limit.dec=64", None),
    ("walks.prefill.capture_limit.dec=0", None),
    ("walks.prefill.budget.tokens=64", None),
    ("walks.prefill.budget.tokens=16", None),
    # decode is not captured (capture=False): budgets only, below 8 are [1, 2, 4]
    ("walks.decode.budget.seqs=4", None),
    ("walks.decode.budget.seqs=2", None),
    # the device is more than 36 pages over: the pool goes down to the 64 pages a request needs
    ("resources.kv.pages=64", TRIM_FIXED_PAGES),
    # ws: 64 MiB per slot against a need of a few MiB, in two slots
    ("resources.ws.bytes=null", TRIM_WORKSPACE),
    ("resources.ws.slots=1", TRIM_WORKSPACE),
    ("--gpus 2", None),
]


@pytest.fixture(scope="module")
def gpu_failing():
    from graphc.passes.suggest_remedies import candidates

    need = planner(gpu_model(), "h100")({}).placement.devices[0].total
    replan = planner(gpu_model(), "h100", need - 100 * MiB)      # 100 MiB over: the workspace alone fits it
    result = replan({})
    return result, replan, candidates(result)


def test_candidates_for_every_kind_of_remedy(gpu_failing):
    result, _, cands = gpu_failing
    (d,) = result.placement.devices
    assert -d.free > 36 * BIG_PAGE            # so the pool shrink stops at the longest request's 64 pages
    assert [(c[0], c[4]) for c in cands] == GPU_CANDIDATES
    by_change = {c[0]: c for c in cands}
    assert by_change["walks.wide.capture_limit.enc=8"][1] == {"walks": {"wide": {"capture_limit": {"enc": 8}}}}
    assert by_change["walks.decode.budget.seqs=2"][1] == {"walks": {"decode": {"budget": {"seqs": 2}}}}
    assert by_change["resources.kv.pages=64"][1] == {"resources": {"kv": {"pages": 64}}}
    assert by_change["resources.ws.bytes=null"][1] == {"resources": {"ws": {"bytes": None}}}
    assert by_change["resources.ws.slots=1"][1] == {"resources": {"ws": {"slots": 1}}}
    assert by_change["--gpus 2"][1:3] == ({}, {"num_devices": 2})


def test_remedies_are_replanned_ranked_and_limited(gpu_failing, monkeypatch):
    from graphc.passes import suggest_remedies as sr

    result, replan, cands = gpu_failing
    shown = sr.evaluate(result, {}, replan)
    monkeypatch.setattr(sr, "MAX_SHOWN", 100)
    every = sr.evaluate(result, {}, replan)
    assert len(every) > 10 and shown == every[:10]         # at most ten are shown: the best ten
    changes = [r.change for r in every]
    assert len(set(changes)) == len(changes) and set(changes) <= {c[0] for c in cands}
    # those that fit alone first, then by bytes freed
    assert [r.fits for r in every] == sorted((r.fits for r in every), reverse=True)
    for group in (True, False):
        freed = [r.freed for r in every if r.fits is group]
        assert freed == sorted(freed, reverse=True)
    # each one re-planned: its bytes freed and its verdict are those of a plan compiled with it
    bad = bad_devices(result)
    before = totals(result, bad)
    for r in every:
        new = replan(r.overrides, **r.flag)
        assert r.fits == new.fit.fits
        if not r.flag:
            assert r.freed == before - totals(new, bad), r.change
    assert any(r.fits for r in every) and any(not r.fits for r in every)
    # a second GPU is listed and frees every byte the one device was over
    gpus = next(r for r in every if r.change == "--gpus 2")
    assert gpus.fits and gpus.freed == -result.placement.devices[0].free


def two_blobs() -> gc.Model:
    """Two 1 GiB nodes on walks of their own."""
    return gc.Model(name="two", nodes=[blob_node("a", 1 << 29), blob_node("b", 1 << 29)],
                    walks=[gc.Walk(name="wa", kind="prefill", path=("a",), budget=gc.Budget(tokens=4)),
                           gc.Walk(name="wb", kind="prefill", path=("b",), budget=gc.Budget(tokens=4))])


def over(result) -> int:
    return sum(max(0, -d.free) for d in result.placement.devices)


def test_a_second_gpu_frees_the_bytes_over():
    """Capped 512 MiB below what one GPU needs for both nodes, two GPUs fit: the remedy frees all
    512 MiB that were over, and no more."""
    from graphc.passes.suggest_remedies import evaluate

    need = planner(two_blobs(), "h100")({}).placement.devices[0].total
    replan = planner(two_blobs(), "h100", need - 512 * MiB)
    result = replan({})
    assert result.placement.devices[0].free == -512 * MiB
    (gpus,) = [r for r in evaluate(result, {}, replan) if r.flag]
    assert (gpus.change, gpus.flag, gpus.overrides) == ("--gpus 2", {"num_devices": 2}, {})
    assert gpus.fits and gpus.freed == 512 * MiB
    assert replan({}, num_devices=2).fit.fits


def test_a_second_gpu_that_only_helps():
    """Capped 64 MiB below what one node needs on a GPU of its own: two GPUs are both over, by less
    in all than one GPU was. The remedy helps, and frees the difference of the bytes over."""
    from graphc.passes.suggest_remedies import evaluate

    alone = max(d.total for d in planner(two_blobs(), "h100", num_devices=2)({}).placement.devices)
    replan = planner(two_blobs(), "h100", alone - 64 * MiB)
    result, spread = replan({}), replan({}, num_devices=2)
    assert all(d.free < 0 for d in spread.placement.devices) and 0 < over(spread) < over(result)
    (gpus,) = [r for r in evaluate(result, {}, replan) if r.flag]
    assert not gpus.fits and gpus.freed == over(result) - over(spread)


def test_one_node_gets_no_gpu_it_cannot_use():
    """A node is never split, so a second GPU frees nothing for a one-node model: it is a candidate
    but not a remedy. Eight GPUs are the most a plan gets: no ninth is suggested."""
    from graphc.passes.suggest_remedies import candidates, evaluate

    model = gc.Model(name="one", nodes=[blob_node("a", 1 << 29)],
                     walks=[gc.Walk(name="w", kind="prefill", path=("a",), budget=gc.Budget(tokens=4))])
    replan = planner(model, "h100", 1 << 30)
    result = replan({})
    assert not result.fit.fits
    assert "--gpus 2" in [c[0] for c in candidates(result)]
    remedies = evaluate(result, {}, replan)
    assert remedies and "--gpus 2" not in [r.change for r in remedies]
    assert all(r.freed > 0 for r in remedies)
    eight = planner(model, "h100", 1 << 30, num_devices=8)({})
    assert not eight.fit.fits and len(eight.placement.devices) == 8
    assert not [c for c in candidates(eight) if c[0].startswith("--gpus")]


def test_only_nodes_and_pools_of_the_device_that_is_over():
    """Two GPUs: a small node pinned to GPU 0 (it fits), the decoder and its fixed pool on GPU 1,
    over by 5 MiB and 123 B: 3 pages of 2 MiB. The candidates touch GPU 1's walk and pool only, the
    pool shrinks by exactly those 3 pages, and that frees 6 MiB on GPU 1 and makes it fit."""
    from graphc.passes.suggest_remedies import candidates, evaluate

    def model():
        return gc.Model(name="split", nodes=[blob_node("small", device=0), dec_node(device=1, kv=BIG_KV)],
                        resources=[big_pool("kv", 100)],
                        walks=[gc.Walk(name="first", kind="prefill", path=("small",), budget=gc.Budget(tokens=4)),
                               gc.Walk(name="prefill", kind="prefill", path=("dec",), ladder=(16, 64),
                                       budget=gc.Budget(tokens=128, seqs=4))])
    need = planner(model(), "h100", num_devices=2)({}).placement.devices[1].total
    replan = planner(model(), "h100", need - 5 * MiB - 123, num_devices=2)
    result = replan({})
    assert bad_devices(result) == {1} and result.placement.devices[1].free == -(5 * MiB + 123)
    assert [c[0] for c in candidates(result)] == [
        "walks.prefill.capture_limit.dec=64", "walks.prefill.capture_limit.dec=0",
        "walks.prefill.budget.tokens=64", "walks.prefill.budget.tokens=16",
        "resources.kv.pages=97", "--gpus 3"]
    remedies = {r.change: r for r in evaluate(result, {}, replan)}
    shrink = remedies["resources.kv.pages=97"]
    assert shrink.fits and shrink.freed == 3 * BIG_PAGE and shrink.trim == TRIM_FIXED_PAGES
    assert "--gpus 3" not in remedies                  # both nodes are pinned: a third GPU frees nothing


# ------------------------------------------------------------------ cpu: freed bytes by hand

PAGE = 2 * 2 * 16 * 1 * 64 * 2          # K, V x 2 layers x 16 tokens x 1 kv head x 64 dims x 2 B = 8 KiB
DEC_WEIGHTS = 64 * 256 * 2 + 256 * 512 * 2   # up [256, 64] and down [512, 256] bf16 (256-B multiples)


def small_pool(name: str, pages: int | None, **kw) -> PagedKVSpec:
    return PagedKVSpec(name=name, num_layers=2, num_qo_heads=8, num_kv_heads=1, head_dim=64, page_size=16,
                       max_seq_len=64, pages=pages, **kw)            # 64 tokens: 4 pages


def dec_peak(tokens: int) -> int:
    """Live bytes at the peak of Dec's step (ffn 256): its [T, 512] bf16 projection and the [T, 8, 64]
    bf16 the attention call returns, 1024 B per token each (up and gelu, 512 B per token each, are
    freed before)."""
    return 2 * 1024 * tokens


def test_freed_bytes_and_ranking_by_hand():
    """cpu: the ledger is weights + pool + workspace slots + the largest eager step. The device is
    over by 2 pages and 100 B, so every remedy that frees more than that fits."""
    from graphc.passes.suggest_remedies import evaluate

    model = gc.Model(name="hand", nodes=[dec_node()],
                     resources=[WorkspaceSpec(name="ws", bytes=MiB, slots=2), small_pool("kv", 40, workspace="ws")],
                     walks=[gc.Walk(name="prefill", kind="prefill", path=("dec",), budget=gc.Budget(tokens=12, seqs=2))])
    need = DEC_WEIGHTS + 40 * PAGE + 2 * MiB + dec_peak(12)
    over = 2 * PAGE + 100
    replan = planner(model, "cpu", need - over)
    result = replan({})
    assert result.placement.devices[0].total == need
    got = [(r.change, r.freed, r.fits, r.trim) for r in evaluate(result, {}, replan)]
    assert got == [
        ("resources.ws.bytes=null", 2 * MiB, True, TRIM_WORKSPACE),     # torch keeps no partials: need 0
        ("resources.ws.slots=1", MiB, True, TRIM_WORKSPACE),
        ("resources.kv.pages=37", 3 * PAGE, True, TRIM_FIXED_PAGES),    # ceil(over / page) = 3 pages
        ("walks.prefill.budget.tokens=2", dec_peak(12) - dec_peak(2), True, None),
        ("walks.prefill.budget.tokens=8", dec_peak(12) - dec_peak(8), False, None),   # helps: 8 KiB of 16 KiB
    ]
    assert not [r for r in evaluate(result, {}, replan) if r.flag]      # no GPU to add on the cpu target


def test_pool_candidates_when_pools_are_short():
    """One device, in memory, with four fixed pools of a 4-page request: a (1 page) and b (2) are too
    short, c holds exactly 4, d 9. Each short pool may grow to 4 pages or allow requests of the
    tokens it holds; nothing shrinks, since no byte is over. Each of those four changes fixes one of
    the two short pools: none fits alone, each helps."""
    from graphc.passes.suggest_remedies import candidates, evaluate

    model = gc.Model(name="short", nodes=[dec_node(pools=("a", "b", "c", "d"))],
                     resources=[small_pool("a", 1), small_pool("b", 2), small_pool("c", 4), small_pool("d", 9)],
                     walks=[gc.Walk(name="prefill", kind="prefill", path=("dec",), budget=gc.Budget(tokens=12, seqs=2))])
    replan = planner(model, "cpu")
    result = replan({})
    assert all(p.over_bytes == 0 for p in result.fit.problems) and len(result.fit.problems) == 2
    assert [(c[0], c[4]) for c in candidates(result)] == [
        ("walks.prefill.budget.tokens=8", None), ("walks.prefill.budget.tokens=2", None),
        ("resources.a.pages=4", None), ("resources.a.max_seq_len=16", TRIM_SEQ_LEN),
        ("resources.b.pages=4", None), ("resources.b.max_seq_len=32", TRIM_SEQ_LEN)]
    got = {(r.change, r.freed, r.fits) for r in evaluate(result, {}, replan)}
    assert got == {("resources.a.max_seq_len=16", 0, False), ("resources.b.max_seq_len=32", 0, False),
                   ("resources.a.pages=4", -3 * PAGE, False), ("resources.b.pages=4", -2 * PAGE, False)}


def test_a_fill_pool_left_without_pages():
    """A fill pool on a device its weights already overflow gets 0 pages: requests of 0 tokens are
    no remedy, and a fill pool has no page count to shrink."""
    from graphc.passes.suggest_remedies import candidates

    model = gc.Model(name="fill", nodes=[dec_node(cfg=(256, 1, 1 << 20))], resources=[small_pool("kv", None)],
                     walks=[gc.Walk(name="prefill", kind="prefill", path=("dec",), budget=gc.Budget(tokens=12, seqs=2))])
    result = planner(model, "cpu", MiB)({})
    assert result.placement.devices[0].kv_pages == {"kv": 0}
    assert [c[0] for c in candidates(result)] == ["walks.prefill.budget.tokens=8", "walks.prefill.budget.tokens=2"]


def test_a_candidate_that_cannot_be_planned_is_skipped():
    """Quad folds its rows 4 at a time: a budget of 2 tokens cannot be traced, so that candidate is
    dropped, and the candidates after it are still re-planned."""
    from graphc.passes.suggest_remedies import candidates, evaluate

    model = gc.Model(name="quad", nodes=[blob_node("quad", module=Quad), dec_node()],
                     resources=[small_pool("kv", 40)],
                     walks=[gc.Walk(name="q", kind="prefill", path=("quad",), budget=gc.Budget(tokens=12)),
                            gc.Walk(name="prefill", kind="prefill", path=("dec",), budget=gc.Budget(tokens=12, seqs=2))])
    full = planner(model, "cpu")({}).placement.devices[0].total
    replan = planner(model, "cpu", full - PAGE)
    result = replan({})
    assert [c[0] for c in candidates(result)][:2] == ["walks.q.budget.tokens=8", "walks.q.budget.tokens=2"]
    changes = [r.change for r in evaluate(result, {}, replan)]
    assert "walks.q.budget.tokens=2" not in changes
    assert "resources.kv.pages=39" in changes and "walks.prefill.budget.tokens=2" in changes


# ------------------------------------------------------------------ workspaces

def test_workspace_candidates_only_for_what_can_shrink():
    """exact: declared at its need rounded up to a MiB, one slot: nothing to shrink. auto: sized by
    the compiler (bytes=null) in two slots: one slot may go. big: declared far above its need in two
    slots: both. The pools decode on fa2 (asked for); their need is FlashInfer's fa2 decode partials (their
    prefill runs on fa3, which keeps none): padded = 16 blocks/SM x 132 SMs / 8 kv heads = 264 rows of 8 heads x 128 dims
    in fp32, + 8 x 264 fp32 scores = 1,089,792 B, 2 MiB rounded up."""
    from graphc.passes.suggest_remedies import candidates

    need = 8 * 264 * 128 * 4 + 8 * 264 * 4
    assert need == 1_089_792
    model = gc.Model(name="ws", nodes=[dec_node(pools=("p", "q", "r"), kv=BIG_KV)],
                     resources=[WorkspaceSpec(name="exact", bytes=2 * MiB), WorkspaceSpec(name="auto", slots=2),
                                WorkspaceSpec(name="big", bytes=64 * MiB, slots=2),
                                big_pool("p", 64, workspace="exact", decode_backend="fa2"),
                                big_pool("q", 64, workspace="auto", decode_backend="fa2"),
                                big_pool("r", 64, workspace="big", decode_backend="fa2")],
                     walks=[gc.Walk(name="decode", kind="decode", path=("dec",), budget=gc.Budget(seqs=4))])
    result = planner(model, "h100", 1 << 30)({})
    assert not result.fit.fits
    assert result.sizing.resources.workspaces["exact"].need.bytes == need
    ws = [c[0] for c in candidates(result) if c[0].startswith("resources.") and "pages" not in c[0]]
    assert ws == ["resources.auto.slots=1", "resources.big.bytes=null", "resources.big.slots=1"]


# ------------------------------------------------------------------ --fit

def test_fit_trims_in_order_and_records_them():
    """Over by far too much for any one trim, with one pool too short as well: --fit lets the
    compiler size the workspace, then captures none of the encoder's walk (its rungs go before any
    pool), shrinks the fixed pool p1 to the 64 pages a request needs, lowers the encoder's budget
    (the device is then 1 byte over), and last lets p2's 10 pages hold requests of 640 tokens."""
    def model():
        return gc.Model(
            name="trims", nodes=[enc_node(cfg=(16384, 2, 0)), dec_node(pools=("p1", "p2"), kv=BIG_KV)],
            resources=[WorkspaceSpec(name="wse", bytes=256 * MiB), ragged("attn", "wse"),
                       big_pool("p1", 150), big_pool("p2", 10)],
            walks=[gc.Walk(name="audio", kind="prefill", path=("enc",), ladder=(1, 2, 4, 8), budget=gc.Budget(windows=16)),
                   gc.Walk(name="prefill", kind="prefill", path=("dec",), ladder=(16, 64),
                           budget=gc.Budget(tokens=128, seqs=4)),
                   gc.Walk(name="decode", kind="decode", path=("dec",), budget=gc.Budget(seqs=8))])
    first = [{"resources": {"wse": {"bytes": None}}}, {"walks": {"audio": {"capture_limit": {"enc": 0}}}},
             {"resources": {"p1": {"pages": 64}}}]
    full = planner(model(), "h100")
    steps = [{}]
    for s in first:
        steps.append(merge(steps[-1], s))
    need = [full(ov).placement.devices[0].total for ov in steps]
    assert need == sorted(need, reverse=True) and len(set(need)) == len(need)
    cap = need[-1] - 1
    src = ModelSource(MODEL_FILE, "trims", model())
    out = compile_model(src, "h100", memory_cap=cap, headroom=0, fit=True)
    changes = [t.change for t in out.trimmed]
    assert changes[:3] == ["resources.wse.bytes=null", "walks.audio.capture_limit.enc=0", "resources.p1.pages=64"]
    assert changes[3].startswith("walks.audio.budget.windows=") and changes[4:] == ["resources.p2.max_seq_len=640"]
    assert [t.trim for t in out.trimmed] == [TRIM_WORKSPACE, TRIM_ENCODER_RUNGS, TRIM_FIXED_PAGES,
                                            TRIM_ENCODER_BUDGET, TRIM_SEQ_LEN]
    # each trim freed what the plans before and after it tell apart, and the plan records them
    replan = planner(model(), "h100", cap)
    ov = {}
    for t in out.trimmed:
        before = replan(ov).placement.devices[0].total
        ov = merge(ov, t.overrides)
        assert t.freed == before - replan(ov).placement.devices[0].total, t.change
    assert out.plan.overrides == ov and out.result.fit.fits
    assert [(p.change, p.freed_bytes) for p in out.plan.trimmed] == [(t.change, t.freed) for t in out.trimmed]


def test_fit_takes_a_trim_that_fits_alone_before_one_that_frees_more():
    """Two identical GPUs, each 10 MiB over. Workspace `shared` (64 MiB x 2 slots) is on both; `wa`
    and `wb` (512 MiB each) on one each. Letting the compiler size `shared` (to its 1 MiB floor: fa3
    keeps no partials) makes both fit; so does one slot of it, freeing less; `wa` frees the most but
    leaves GPU 1 over. --fit takes the workspace trim that fits and frees the most: one trim."""
    def model():
        res = [WorkspaceSpec(name="shared", bytes=64 * MiB, slots=2), WorkspaceSpec(name="wa", bytes=512 * MiB),
               WorkspaceSpec(name="wb", bytes=512 * MiB)]
        nodes, walks = [], []
        for i, (node, big) in enumerate((("a", "wa"), ("b", "wb"))):
            res += [ragged(f"{node}1", "shared", "fa3"), ragged(f"{node}2", big, "fa3")]
            nodes.append(enc_node(node, module=Enc2, resources={"attn": f"{node}1", "attn2": f"{node}2"}, device=i))
            walks.append(gc.Walk(name=f"w{node}", kind="prefill", path=(node,), budget=gc.Budget(windows=4)))
        return gc.Model(name="pair", nodes=nodes, resources=res, walks=walks)
    from graphc.passes.suggest_remedies import evaluate

    need = [d.total for d in planner(model(), "h100", num_devices=2)({}).placement.devices]
    assert need[0] == need[1]
    cap = need[0] - 10 * MiB
    replan = planner(model(), "h100", cap, num_devices=2)
    offered = {r.change: r for r in evaluate(replan({}), {}, replan) if r.trim == TRIM_WORKSPACE}
    assert offered["resources.shared.bytes=null"].fits and offered["resources.shared.slots=1"].fits
    assert not offered["resources.wa.bytes=null"].fits
    assert offered["resources.wa.bytes=null"].freed > offered["resources.shared.bytes=null"].freed \
        > offered["resources.shared.slots=1"].freed
    out = compile_model(ModelSource(MODEL_FILE, "pair", model()), "h100", 2, memory_cap=cap, headroom=0, fit=True)
    assert [t.change for t in out.trimmed] == ["resources.shared.bytes=null"]


def test_fit_stops_when_no_trim_is_left():
    """Nothing in a one-node decoder plan is a trim (tokens axes, a GPU): --fit re-plans each
    candidate once, finds no trim, and gives up with the plan as it was."""
    from graphc.passes.suggest_remedies import apply_trims, candidates

    model = gc.Model(name="notrim", nodes=[blob_node("a", 1 << 29)],
                     walks=[gc.Walk(name="w", kind="prefill", path=("a",), budget=gc.Budget(tokens=16))])
    replan = planner(model, "h100", 1 << 30)
    result = replan({})
    calls = []

    def counting(ov, **kw):
        calls.append(ov)
        return replan(ov, **kw)
    out, ov, trimmed = apply_trims(result, {}, counting)
    assert out is result and ov == {} and trimmed == []
    assert len(calls) == len(candidates(result))


def test_fit_is_bounded(monkeypatch):
    """A search that never fits stops after max_steps trims (24 by default)."""
    from graphc.passes import suggest_remedies as sr

    failing = SimpleNamespace(fit=SimpleNamespace(fits=False))
    n = iter(range(1000))
    monkeypatch.setattr(sr, "evaluate", lambda result, overrides, replan: [
        sr.Remedy(f"step {next(n)}", {"k": 1}, {}, 1, False, "", TRIM_WORKSPACE)])
    _, _, trimmed = sr.apply_trims(failing, {}, lambda ov: failing)
    assert len(trimmed) == 24
    _, _, trimmed = sr.apply_trims(failing, {}, lambda ov: failing, max_steps=3)
    assert [t.change for t in trimmed] == ["step 24", "step 25", "step 26"]


# ------------------------------------------------------------------ a fill pool that is too short

def test_remedies_for_a_short_fill_pool_report_what_they_free():
    """A fill pool (pages=None) left 50 of the 64 pages a request needs. Letting the compiler size
    the 2 x 64 MiB workspace frees over 100 MiB (54 more pages of 2 MiB, the most of any remedy);
    it should say so and come first, not report ~0 B like every other remedy."""
    from graphc.passes.suggest_remedies import evaluate

    def model():
        return gc.Model(name="fill", nodes=[enc_node(), dec_node(kv=BIG_KV)],
                        resources=[WorkspaceSpec(name="ws", bytes=64 * MiB, slots=2), ragged("attn", "ws"),
                                   big_pool("kv", None)],
                        walks=[gc.Walk(name="wide", kind="prefill", path=("enc",), budget=gc.Budget(windows=32)),
                               gc.Walk(name="prefill", kind="prefill", path=("dec",), ladder=(16, 64),
                                       budget=gc.Budget(tokens=128, seqs=4))])
    roomy = planner(model(), "h100", 8 << 30)({}).placement.devices[0]
    replan = planner(model(), "h100", roomy.total - (roomy.kv_pages["kv"] - 50) * BIG_PAGE)
    result = replan({})
    assert result.placement.devices[0].kv_pages == {"kv": 50} and result.fit.problems[0].over_bytes == 0
    remedies = evaluate(result, {}, replan)
    ws = next(r for r in remedies if r.change == "resources.ws.bytes=null")
    assert replan(ws.overrides).placement.devices[0].kv_pages["kv"] - 50 > 50     # what it gives the pool
    assert ws.freed > 100 * MiB and remedies[0] is ws
