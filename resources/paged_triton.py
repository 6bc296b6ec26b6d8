"""Paged decode in one Triton launch: the step's K/V append and its attention, the 'triton' decode backend of
PagedKVSpec.

FlashInfer's captured decode is three launches a layer (append_paged_kv_cache, the split-KV decode kernel and
the merge of its splits). Here a program per (sequence, kv head, split) does all three:

- its split of the sequence's cached keys, in blocks of BLOCK_N gathered through the page table, against the
  queries of every head of the kv head's group stacked as rows ([ROWS, D], ROWS >= 16 for tl.dot), with the
  online softmax in fp32 (exp2 of the scaled scores; keys, values and p in q's dtype for the products, as
  FlashInfer does);
- the split that holds the step's own position (the last key) takes that key and value from k and v, rounded to
  the cache's dtype as every other key was, and writes them into their page: no program reads that slot from
  the cache, so the write needs no order against the reads;
- a sequence of one split writes its output; otherwise each split writes its unnormalised partial (acc, max,
  sum) to the workspace and, after a barrier of its threads, counts itself in with an atomic add on its
  (sequence, kv head) counter; the split that arrives last merges the partials (read through L2: .cg), writes
  the output and puts the counter back to 0 for the next launch.

A launch has a fixed grid (seqs x kv heads x splits, the splits set by the rung: PagedKVSpec.decode_splits).
Each sequence cuts its keys into splits of a whole number of key blocks (_chunk: about sqrt(blocks / BALANCE)
blocks a split, so a split's blocks and the merge's partials, each read one after another, stay balanced; at
least blocks / splits); the programs past its last split return at once and are not counted.

tests/unit/test_paged_triton.py runs it under Triton's interpreter on CPU against PagedTorch;
tests/gpu/test_paged_triton_gpu.py compiled on the GPU against fp32 and FlashInfer.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from resources.base import StepShape
from resources.paged_kv import PagedKVSpec, paged_plan
from resources.pdl import _pdl_start, _pdl_wait, pdl_launch

LOG2E = 1.4426950408889634
# The blocks, from an H100 sweep of the kernel with a split's least key count as its knob (run paged-sweep-h100,
# docs/benchmarks.md): the fastest least count was 64 keys at 256 keys a sequence, 128 at 2,048 and 256 at 8,192,
# which BALANCE 8 gives (_chunk); 32-key blocks were slower in every cell; 2 stages within 3% of 3.
BLOCK_N = 64          # keys a block (four pages of 16)
BALANCE = 8           # a key block's time over a merged partial's (_chunk)
MERGE_SPLITS = 8      # partials the merge loads at once
NUM_STAGES = 3        # Triton's software pipelining of the key blocks


@triton.jit
def _online(q, k, v, keep, m, l, acc, scale_log2):
    """One block of keys folded into the running max m, sum l and unnormalised output acc of each row."""
    s = tl.dot(q, tl.trans(k), out_dtype=tl.float32) * scale_log2
    s = tl.where(keep[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, out_dtype=tl.float32)
    return m_new, l, acc


@triton.jit
def _own_key(q, k_ptr, v_ptr, cache_ptr, slot, c_kv, m, l, acc, scale_log2, d):
    """The step's own key and value (from k and v, in the cache's dtype as every other key is read) folded in,
    and written into their cache slot."""
    kn = tl.load(k_ptr + d).to(cache_ptr.dtype.element_ty)
    vn = tl.load(v_ptr + d).to(cache_ptr.dtype.element_ty)
    s = tl.sum(q.to(tl.float32) * kn.to(tl.float32)[None, :], axis=1) * scale_log2
    m_new = tl.maximum(m, s)
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new)
    l = l * alpha + p
    acc = acc * alpha[:, None] + p[:, None] * vn.to(tl.float32)[None, :]
    tl.store(cache_ptr + slot + d, kn)
    tl.store(cache_ptr + slot + c_kv + d, vn)
    return m_new, l, acc


@triton.jit
def _merge(part_ptr, o_ptr, o_h, first, nsplit, SPLITS, GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
           CH: tl.constexpr):
    """The group's output rows from their nsplit partials (workspace row first + r x SPLITS + j), CH splits a
    load, each load's maxima, sums and outputs folded into the running ones (rows past the group: 0)."""
    r, c, d = tl.arange(0, GP), tl.arange(0, CH), tl.arange(0, D)
    rm = r < GROUP
    m = tl.where(rm, float("-inf"), 0.0)
    l = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    for j0 in range(0, nsplit, CH):
        j = j0 + c
        jm = (j < nsplit)[:, None] & rm[None, :]
        at = (first + r[None, :] * SPLITS + j[:, None]).to(tl.int64) * (D + 2)      # [CH, GP]
        mj = tl.where(rm[None, :], tl.load(part_ptr + at + D, mask=jm, other=float("-inf"), cache_modifier=".cg"), 0.0)
        lj = tl.load(part_ptr + at + D + 1, mask=jm, other=0.0, cache_modifier=".cg")
        aj = tl.load(part_ptr + at[:, :, None] + d[None, None, :], mask=jm[:, :, None], other=0.0,
                     cache_modifier=".cg")
        m_new = tl.maximum(m, tl.max(mj, axis=0))
        alpha, w = tl.exp2(m - m_new), tl.exp2(mj - m_new[None, :])
        l = l * alpha + tl.sum(lj * w, axis=0)
        acc = acc * alpha[:, None] + tl.sum(aj * w[:, :, None], axis=0)
        m = m_new
    o = acc / tl.where(l == 0.0, 1.0, l)[:, None]
    tl.store(o_ptr + r[:, None] * o_h + d[None, :], o.to(o_ptr.dtype.element_ty), mask=rm[:, None])


@triton.jit
def _chunk(keys, SPLITS, BLOCK: tl.constexpr, BALANCE: tl.constexpr):
    """Keys a split reads: c blocks, the least with c x c x BALANCE >= the sequence's blocks, and no fewer than
    its blocks over SPLITS (the launch's splits). A split's c blocks run one after another and the merge reads
    blocks / c partials one after another; a x c + b x blocks / c is least at c = sqrt(blocks x b / a), and
    BALANCE = a / b."""
    blocks = tl.cdiv(keys, BLOCK)
    c = tl.cdiv(blocks, SPLITS)
    while c * c * BALANCE < blocks:
        c += 1
    return c * BLOCK


@triton.jit(do_not_specialize=["SPLITS"])     # one compile for every rung's splits
def _paged_decode(q_ptr, k_ptr, v_ptr, o_ptr, cache_ptr, indptr_ptr, indices_ptr, last_ptr, part_ptr, count_ptr,
                  scale_log2, q_t, q_h, k_t, k_h, v_t, v_h, o_t, o_h, c_page, c_kv, c_row, c_head, SPLITS,
                  HQ: tl.constexpr, HKV: tl.constexpr, PAGE: tl.constexpr,
                  GROUP: tl.constexpr, GP: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                  BALANCE: tl.constexpr, CH: tl.constexpr, PDL: tl.constexpr = False):
    _pdl_start(PDL)
    _pdl_wait(PDL)                      # with PDL: q, k, v and the page table are the kernels' before
    b, h, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    p0 = tl.load(indptr_ptr + b)
    own = (tl.load(indptr_ptr + b + 1) - p0 - 1) * PAGE + tl.load(last_ptr + b) - 1   # the step's position
    chunk = _chunk(own + 1, SPLITS, BLOCK, BALANCE)
    nsplit = tl.cdiv(own + 1, chunk)
    if sp < nsplit:
        r = tl.arange(0, ROWS)
        rm = r < GROUP
        heads = h * GROUP + r
        d = tl.arange(0, D)
        q = tl.load(q_ptr + b.to(tl.int64) * q_t + heads[:, None] * q_h + d[None, :], mask=rm[:, None], other=0.0)
        m = tl.full([ROWS], float("-inf"), tl.float32)
        l = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, D], tl.float32)
        start = sp * chunk
        end = tl.minimum(start + chunk, own)
        for n0 in range(start, end, BLOCK):
            pos = n0 + tl.arange(0, BLOCK)
            keep = pos < end
            page = tl.load(indices_ptr + p0 + pos // PAGE, mask=keep, other=0)
            off = page.to(tl.int64) * c_page + (pos % PAGE) * c_row + h * c_head
            k = tl.load(cache_ptr + off[:, None] + d[None, :], mask=keep[:, None], other=0.0).to(q.dtype)
            v = tl.load(cache_ptr + c_kv + off[:, None] + d[None, :], mask=keep[:, None], other=0.0).to(q.dtype)
            m, l, acc = _online(q, k, v, keep, m, l, acc, scale_log2)
        if sp == nsplit - 1:       # this split holds the step's own position
            slot = tl.load(indices_ptr + p0 + own // PAGE).to(tl.int64) * c_page + (own % PAGE) * c_row + h * c_head
            m, l, acc = _own_key(q, k_ptr + b.to(tl.int64) * k_t + h * k_h, v_ptr + b.to(tl.int64) * v_t + h * v_h,
                                 cache_ptr, slot, c_kv, m, l, acc, scale_log2, d)
        out_at = o_ptr + b.to(tl.int64) * o_t + heads[:, None] * o_h + d[None, :]
        if nsplit == 1:
            tl.store(out_at, (acc / l[:, None]).to(o_ptr.dtype.element_ty), mask=rm[:, None])
        else:
            first = (b * HQ + h * GROUP) * SPLITS
            at = (first + r * SPLITS + sp).to(tl.int64) * (D + 2)
            tl.store(part_ptr + at[:, None] + d[None, :], acc, mask=rm[:, None])
            tl.store(part_ptr + at + D, m, mask=rm)
            tl.store(part_ptr + at + D + 1, l, mask=rm)
            tl.debug_barrier()     # every thread's partial stored before the count releases them
            if tl.atomic_add(count_ptr + b * HKV + h, 1, sem="acq_rel") == nsplit - 1:    # the last split in
                _merge(part_ptr, o_ptr + b.to(tl.int64) * o_t + h * GROUP * o_h, o_h, first, nsplit, SPLITS, GROUP,
                       GP, D, CH)
                tl.store(count_ptr + b * HKV + h, 0)


class PagedTriton:
    """PagedKVSpec's decode steps on _paged_decode, with PagedFlashInfer's calls: plan(qo_lens, kv_lens,
    page_tables) on the host, then __call__(layer, q, k, v), capturable when built for a rung: its page table,
    lengths and counters are fixed buffers (those PagedKVSpec.wrapper_allocs counts), and plan() rewrites the
    first three in place.

    workspace: the resource's float workspace (the partials of a rung's splits: PagedKVSpec.float_workspace);
    an eager backend (rung None) makes its buffers at each plan.
    """

    def __init__(self, spec: PagedKVSpec, workspace: torch.Tensor, cache: torch.Tensor,
                 rung: StepShape | None = None, pdl: bool = False):
        if rung is not None and rung.phase != "decode":
            raise ValueError(f"resource '{spec.name}': the triton backend runs decode steps only, not a "
                             f"{rung.phase} rung")
        from resources.capabilities import unfit

        if why := unfit(spec, "triton"):
            raise ValueError(f"resource '{spec.name}': the triton decode backend cannot run it: {why}")
        self.spec, self.cache, self.rung, self.workspace = spec, cache, rung, workspace
        self.pdl = pdl              # launched with programmatic dependent launch (the node's pdl knob)
        self.buffers = {}
        if rung is not None:      # the fixed buffers the plan counts (PagedKVSpec.wrapper_allocs)
            self.buffers = {name: torch.zeros(nbytes // 4, dtype=torch.int32, device=cache.device)
                            for name, nbytes in spec.wrapper_allocs("triton", rung)}
        self._seqs: int | None = None

    def _check(self, qo_lens: list[int], kv_lens: list[int]) -> None:
        if any(q != 1 for q in qo_lens) or any(kv < 1 for kv in kv_lens):
            raise ValueError("the triton decode backend takes one new row per sequence (and so one key at least); "
                             f"got new rows {qo_lens[:8]} over keys {kv_lens[:8]}: run the step on the prefill "
                             "backend")
        if self.rung is not None and len(qo_lens) != self.rung.seqs:
            raise ValueError(f"a captured rung takes exactly {self.rung.seqs} sequences, got {len(qo_lens)}: "
                             "pad with sequences on a scratch page")

    def plan(self, qo_lens: list[int], kv_lens: list[int], page_tables: list[list[int]]) -> None:
        self._check(qo_lens, kv_lens)
        p = paged_plan(qo_lens, kv_lens, page_tables, self.spec.page_size)
        host = {"kv_indptr": p.kv_indptr, "kv_indices": p.kv_indices, "kv_last_page_len": p.kv_last_page_len}
        device = self.cache.device
        if self.rung is None:
            self.buffers = {name: torch.tensor(v, dtype=torch.int32).to(device, non_blocking=True)
                            for name, v in host.items()}
            self.buffers["split_counts"] = torch.zeros(len(qo_lens) * self.spec.num_kv_heads, dtype=torch.int32,
                                                       device=device)
        else:
            for name, v in host.items():       # staged now: no host sync
                self.buffers[name][:len(v)].copy_(torch.tensor(v, dtype=torch.int32), non_blocking=True)
        self._seqs = len(qo_lens)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q [T, Hq, D], k/v [T, Hkv, D]; cache[layer] [pages, 2, page, Hkv, D] takes this step's k/v in place
        if self._seqs is None:
            raise RuntimeError("plan() the step's layout before calling the backend")
        s, n = self.spec, self._seqs
        if q.shape[0] != n or k.shape[0] != n or v.shape[0] != n:
            raise ValueError(f"the step was planned for {n} rows; q, k and v have {q.shape[0]}, {k.shape[0]} "
                             f"and {v.shape[0]}")
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        cache, out = self.cache[layer], torch.empty_like(q)
        splits = s.decode_splits(n)
        need = s.float_workspace("triton", StepShape(rows=n, seqs=n, kv_len=s.max_seq_len, phase="decode"), 0).bytes
        if self.workspace.numel() * self.workspace.element_size() < need:
            raise ValueError(f"resource '{s.name}': {n} sequences' split partials take {need} B of float "
                             f"workspace; it has {self.workspace.numel() * self.workspace.element_size()}")
        part = self.workspace.view(torch.uint8)[:need].view(torch.float32)
        b, group = self.buffers, s.num_qo_heads // s.num_kv_heads
        _paged_decode[(n, s.num_kv_heads, splits)](
            q, k, v, out, cache, b["kv_indptr"], b["kv_indices"], b["kv_last_page_len"], part, b["split_counts"],
            LOG2E / math.sqrt(s.head_dim), q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
            v.stride(1), out.stride(0), out.stride(1), cache.stride(0), cache.stride(1), cache.stride(2),
            cache.stride(3), splits, HQ=s.num_qo_heads, HKV=s.num_kv_heads, PAGE=s.page_size, GROUP=group,
            GP=triton.next_power_of_2(group), ROWS=max(16, triton.next_power_of_2(group)), D=s.head_dim,
            BLOCK=BLOCK_N, BALANCE=BALANCE, CH=MERGE_SPLITS, num_warps=4, num_stages=NUM_STAGES,
            **pdl_launch(self.pdl, q))
        return out
