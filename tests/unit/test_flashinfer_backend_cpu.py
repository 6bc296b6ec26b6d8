"""The FlashInfer backends' CPU side: import without flashinfer, a clear refusal to build without
it, and the host-side plan arithmetic (indptrs, page indices, last-page lengths, append slots)."""
from __future__ import annotations

import importlib
import random
import sys

import pytest
import torch

from resources import flashinfer_backend as fb
from resources.base import StepShape
from resources.paged_kv import PagedKVSpec, PagedTorch, new_cache
from resources.ragged_attention import RaggedAttentionSpec, RaggedTorch

RAGGED = RaggedAttentionSpec(name="enc_attn", num_heads=4, head_dim=16, max_segment=8)
CAUSAL = RaggedAttentionSpec(name="c2w_attn", num_heads=4, head_dim=16, max_segment=8, causal=True, window=3)
PAGED = PagedKVSpec(name="dec_kv", num_layers=2, num_qo_heads=8, num_kv_heads=2, head_dim=16, page_size=4,
                    max_seq_len=40)


@pytest.fixture
def no_flashinfer(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)   # `import flashinfer` now raises ImportError


def test_module_imports_without_flashinfer(no_flashinfer, monkeypatch):
    monkeypatch.delitem(sys.modules, "resources.flashinfer_backend")
    fresh = importlib.import_module("resources.flashinfer_backend")
    assert fresh.int_workspace(RAGGED, "cpu").numel() == RAGGED.int_workspace_bytes


@pytest.mark.parametrize("spec, kwargs", [(RAGGED, {}), (PAGED, {"cache": torch.zeros(1)})])
def test_building_without_flashinfer_names_the_package(no_flashinfer, spec, kwargs):
    with pytest.raises(ImportError, match="flashinfer-python"):
        fb.make_backend(spec, "fa2", torch.zeros(16, dtype=torch.uint8), False, None, **kwargs)


@pytest.mark.parametrize("backend", ["auto", "torch", "flash9"])
def test_names_flashinfer_does_not_serve_are_refused_first(no_flashinfer, backend):
    with pytest.raises(ValueError, match="capabilities.choose"):
        fb.make_backend(RAGGED, backend, torch.zeros(16, dtype=torch.uint8), False, None)


def test_paged_needs_its_pool():
    with pytest.raises(ValueError, match="cache pool"):
        fb.make_backend(PAGED, "fa2", torch.zeros(16, dtype=torch.uint8), False, None)


def test_a_triton_decode_rung_needs_no_flashinfer_and_holds_what_wrapper_allocs_counts(no_flashinfer):
    from resources.paged_triton import PagedTriton

    rung = StepShape(rows=3, seqs=3, kv_len=40, phase="decode")
    b = fb.make_backend(PAGED, "triton", torch.zeros(16, dtype=torch.uint8), True, rung,
                        cache=new_cache(PAGED, 30), decode_backend="triton")
    assert isinstance(b, PagedTriton)
    assert {k: t.numel() * 4 for k, t in b.buffers.items()} == dict(PAGED.wrapper_allocs("triton", rung))


def test_eager_steps_of_a_triton_decode_resource_stay_on_flashinfers_prefill(monkeypatch):
    """An eager backend of a resource that decodes on triton builds FlashInfer's prefill wrapper alone (the
    triton decode has no FlashInfer wrapper), and plans a step of one row per sequence on it."""
    made = []

    class Wrapper:
        def __init__(self, *args, backend=None, **kw):
            made.append((type(self).__name__, backend))

        def reset_workspace_buffer(self, *args):
            pass

        def plan(self, *args, **kw):
            made.append(("plan", type(self).__name__))

    stub = type(sys)("flashinfer")
    stub.BatchPrefillWithPagedKVCacheWrapper = type("Prefill", (Wrapper,), {})
    stub.BatchDecodeWithPagedKVCacheWrapper = type("Decode", (Wrapper,), {})
    monkeypatch.setitem(sys.modules, "flashinfer", stub)
    b = fb.make_backend(PAGED, "fa3", torch.zeros(16, dtype=torch.uint8), False, None, cache=new_cache(PAGED, 30),
                        decode_backend="triton")
    b.plan([1, 1], [5, 9], [[0, 1], [2, 3, 4]])
    assert made == [("Prefill", "fa3"), ("plan", "Prefill")]


# ---------------------------------------------------------------- ragged indptrs

def random_cu(rng: random.Random, segs: int, most: int) -> list[int]:
    cu = [0]
    for _ in range(segs):
        cu.append(cu[-1] + rng.randint(0, most))
    return cu


def test_eager_indptrs_are_the_layout_and_bad_ones_are_refused():
    assert fb.ragged_indptrs([0, 3, 5], [0, 4, 9], None, True) == ([0, 3, 5], [0, 4, 9])
    with pytest.raises(ValueError, match="never decrease"):
        fb.ragged_indptrs([0, 3, 2], [0, 3, 2], None, False)
    with pytest.raises(ValueError, match="2 query segments but 1 key"):
        fb.ragged_indptrs([0, 3, 5], [0, 5], None, False)


@pytest.mark.parametrize("seed", range(40))
def test_captured_indptrs_fill_the_rung_and_keep_every_real_row(seed):
    rng = random.Random(seed)
    spec = rng.choice([RAGGED, CAUSAL])
    rung = StepShape(rows=6 * spec.max_segment, seqs=6, kv_len=spec.max_segment)
    segs = rng.randint(0, rung.seqs - spec.causal)
    cu = random_cu(rng, segs, spec.max_segment)
    qo, kv = fb.ragged_indptrs(cu, cu, rung, spec.causal)
    assert len(qo) == len(kv) == rung.seqs + 1 and qo[-1] == rung.rows
    q = torch.randn(rung.rows, 4, 16, dtype=torch.float64)
    k, v = torch.randn_like(q), torch.randn_like(q)
    ours, ref = RaggedTorch(spec, qo, kv)(q, k, v), RaggedTorch(spec, cu)(q, k, v)
    torch.testing.assert_close(ours[:cu[-1]], ref[:cu[-1]])   # padding rows move no real row's output


def test_padding_rows_join_the_last_segment_without_a_mask_else_take_a_spare_one():
    rung = StepShape(rows=20, seqs=3, kv_len=8)
    assert fb.ragged_indptrs([0, 8, 12], [0, 8, 12], rung, False) == ([0, 8, 20, 20], [0, 8, 12, 12])
    assert fb.ragged_indptrs([0, 8, 12], [0, 8, 12], rung, True) == ([0, 8, 12, 20], [0, 8, 12, 20])
    assert fb.ragged_indptrs([0, 8, 12], [0, 5, 7], rung, False) == ([0, 8, 20, 20], [0, 5, 7, 7])


@pytest.mark.parametrize("cu_q, cu_k, causal, match", [
    ([0, 8, 12, 16], [0, 8, 12, 16], True, "all 3 are in use"),        # causal, no spare segment
    ([0, 8, 12], [0, 5, 7], True, "need a segment"),                   # causal keys of another layout
    ([0, 8, 16, 24, 28], [0, 8, 16, 24, 28], False, "do not fit"),     # too many segments
    ([0, 21], [0, 21], False, "do not fit"),                           # too many rows
])
def test_layouts_a_rung_cannot_hold_are_refused(cu_q, cu_k, causal, match):
    with pytest.raises(ValueError, match=match):
        fb.ragged_indptrs(cu_q, cu_k, StepShape(rows=20, seqs=3, kv_len=8), causal)


# ---------------------------------------------------------------- paged plan

def random_paged(rng: random.Random, spec: PagedKVSpec, pool: int):
    seqs = rng.randint(1, 5)
    kv = [rng.randint(0, spec.max_seq_len) for _ in range(seqs)]
    qo = [rng.randint(0, n) for n in kv]
    pages = rng.sample(range(pool), sum(spec.pages_for(n) for n in kv) + seqs)   # tables may hold spare pages
    tables, at = [], 0
    for n in kv:
        take = spec.pages_for(n) + rng.randint(0, 1)
        tables.append(pages[at:at + take])
        at += take
    return qo, kv, tables


@pytest.mark.parametrize("seed", range(40))
def test_paged_plan_matches_pagedtorch_and_flashinfer_conventions(seed):
    rng, ps = random.Random(seed), PAGED.page_size
    qo, kv, tables = random_paged(rng, PAGED, pool=80)
    p = fb.paged_plan(qo, kv, tables, ps)
    assert p.qo_indptr[-1] == sum(qo) == len(p.batch_indices) == len(p.positions)
    for i, n in enumerate(kv):
        pages = p.kv_indices[p.kv_indptr[i]:p.kv_indptr[i + 1]]
        assert pages == tables[i][:PAGED.pages_for(n)]
        assert 1 <= p.kv_last_page_len[i] <= ps if n else p.kv_last_page_len[i] == 0
        # flashinfer.page.get_seq_lens: max(pages - 1, 0) * page_size + last_page_len
        assert max(len(pages) - 1, 0) * ps + p.kv_last_page_len[i] == n
    # FlashInfer's append writes row r at page kv_indices[kv_indptr[b] + pos // ps], slot pos % ps
    slots = [p.kv_indices[p.kv_indptr[b] + pos // ps] * ps + pos % ps for b, pos in zip(p.batch_indices, p.positions)]
    assert slots == PagedTorch(PAGED, new_cache(PAGED, 80), qo, kv, tables).slots.tolist()


def test_paged_plan_refuses_a_short_table():
    with pytest.raises(ValueError, match="needs 3 pages, has 2"):
        fb.paged_plan([1], [9], [[0, 1]], 4)


def test_paged_plan_refuses_lists_of_different_lengths():
    # a sequence without a length or a table would be dropped from the step without a word
    with pytest.raises(ValueError, match="shorter|longer"):
        fb.paged_plan([1, 1], [3], [[0], [1]], 4)
    with pytest.raises(ValueError, match="shorter|longer"):
        fb.paged_plan([1], [3], [[0], [1]], 4)


# ---------------------------------------------------------------- captured buffers

@pytest.mark.parametrize("spec, rung", [
    (RAGGED, StepShape(rows=48, seqs=6, kv_len=8)),
    (PAGED, StepShape(rows=64, seqs=4, kv_len=40)),
    (PAGED, StepShape(rows=16, seqs=16, kv_len=40, phase="decode")),
])
def test_graph_buffers_are_what_wrapper_allocs_counts(spec, rung):
    ours = {name: t.numel() * t.element_size() for name, t in fb.graph_buffers(spec, rung, "cpu").items()}
    listed = dict(spec.wrapper_allocs("fa2", rung))
    # allocated elsewhere: the int workspace by int_workspace(); FlashInfer's own paged prefill
    # kv_lens buffer; the decode wrapper's qo_indptr (tensor cores) or none at all
    missing = {"int_workspace", "kv_lens"} | ({"qo_indptr"} if rung.phase == "decode" else set())
    assert ours == {k: n for k, n in listed.items() if k not in missing}


@pytest.mark.parametrize("plan, walk", [("qwen3_5_9b_h200", "video_prefill"), ("qwen3_5_9b_h200", "image_prefill"),
                                        ("qwen3_omni_h200", "video_prefill")])
def test_a_full_step_of_small_media_fits_its_captured_vision_rung(plan, walk):
    """A vision step the scheduler fills with its walk's most media (frame groups or images of 10 x 16 patches,
    as a checkpoint-less 9B's 360 x 640 clip gives, as many as its segments and patches allow) pads to its rung, and the padding rows take a segment of their
    own (vision_inputs.segment_bounds): every rung of the family holds that many segments, and the indptrs keep
    each real segment's keys. (Without the padding segment the H200 refuses a 9B video step of 8 frame groups in a
    1,536-row rung: docs/data/h200_2026-12-06/video_q35.txt.)"""
    from graphc.plan import load_plan
    from graphc.runtime.boot import plan_ir
    from graphc.runtime.scheduler import _limits
    from models.components.vision_inputs import segment_bounds
    from tests.conftest import ROOT

    p = load_plan(ROOT / "plans" / f"{plan}.plan")
    ir = plan_ir(p)
    node = next(n for n in ("vision_encoder",) if n in p.nodes)
    step = next(s for s in ir.steps if s.walk == walk and s.node == node)
    spec = ir.model.resource(ir.model.node(node).resources["attn"])
    _, _, per = _limits(ir.model, walk, {node: step.axis})
    units, segments = per[node]
    budget = ir.model.walk(walk).budget
    assert segments == (budget.segments or budget.seqs)     # the scheduler's segments: the walk's media a step
    most = min(segments, units // 160)                      # as many 160-patch groups as the step holds
    cu = segment_bounds([(1, 10, 16)] * most, most * 160)    # a full step's real rows
    checked = 0
    for rung in p.nodes[node].graphs[f"prefill:{step.axis}"]:
        if rung < most * 160:
            continue
        shape = spec.step_shape(step.axis, step.sizes_at(rung), step.phase)
        padded = segment_bounds([(1, 10, 16)] * most, rung)
        qo, kv = fb.ragged_indptrs(padded, padded, shape, spec.causal)
        assert len(qo) == shape.seqs + 1 and qo[-1] == rung and qo[:most + 1] == kv[:most + 1] == cu, rung
        checked += 1
    assert checked, f"no captured rung holds {most} groups"
