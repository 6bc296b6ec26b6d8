"""Paged KV cache attention for the LLM nodes: chunked causal prefill, decode and mixed steps.

One pool per resource: [num_layers, num_pages, 2 (K, V), page_size, num_kv_heads, head_dim], a
single allocation. Backends: FlashInfer's paged prefill/decode wrappers on GPU; torch on the CPU.
torch is imported where a backend runs: a plan made from the disk cache reads the spec without it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field, model_validator

from graphc.errors import InvalidInput
from graphc.units import ceil_div
from resources import flashinfer_sizes as fis
from resources.base import ResourceSpec, Sized, StepShape
from resources.capabilities import USES_FLOAT_WORKSPACE, tensor_core_decode

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}

# The triton decode backend (resources/paged_triton.py) launches sequences x kv heads x splits programs, the
# splits a power of two that brings the launch near DECODE_PROGRAMS (about two for each of an H100's or H200's
# 132 SMs), at most DECODE_MAX_SPLITS.
DECODE_PROGRAMS = 256
DECODE_MAX_SPLITS = 64

if TYPE_CHECKING:
    import torch


class PagedKVSpec(ResourceSpec):
    kind: ClassVar[str] = "paged_kv"
    num_layers: int = Field(ge=1)
    num_qo_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    page_size: int = Field(16, ge=1)
    dtype: str = "bfloat16"
    max_seq_len: int = Field(ge=1)        # the longest request this cache must hold
    pages: int | None = Field(None, ge=1)  # None: fill what the device has left
    fill_share: float = Field(1.0, gt=0)   # split of the leftover between fill pools on a device
    backend: str = "auto"          # prefill and mixed steps
    decode_backend: str = "auto"   # steps of one row per sequence
    workspace: str | None = None
    int_workspace_bytes: int = Field(fis.DEFAULT_INT_WORKSPACE, ge=4096)

    @model_validator(mode="after")
    def _check(self) -> "PagedKVSpec":
        if self.dtype not in _DTYPE_BYTES:
            raise ValueError(f"dtype '{self.dtype}' is not one of {sorted(_DTYPE_BYTES)}")
        if self.num_qo_heads % self.num_kv_heads:
            raise ValueError(f"num_qo_heads {self.num_qo_heads} must be a multiple of num_kv_heads {self.num_kv_heads}")
        return self

    @property
    def is_attention(self) -> bool:
        return True

    @property
    def page_bytes(self) -> int:
        """K and V of one page for every layer."""
        return 2 * self.num_layers * self.page_size * self.num_kv_heads * self.head_dim * _DTYPE_BYTES[self.dtype]

    def page_formula(self) -> str:
        return (f"2 (K,V) x {self.num_layers} layers x {self.page_size} tokens x {self.num_kv_heads} kv heads"
                f" x {self.head_dim} dims x {_DTYPE_BYTES[self.dtype]} B = {self.page_bytes} B per page")

    def pages_for(self, seq_len: int) -> int:
        return ceil_div(seq_len, self.page_size)

    @property
    def min_pages(self) -> int:
        """Pages the longest allowed request needs."""
        return self.pages_for(self.max_seq_len)

    def step_shape(self, axis: str, sizes: dict[str, int], phase: str) -> StepShape:
        rows = sizes.get("tokens", sizes[axis])
        return StepShape(rows=rows, seqs=min(rows, sizes.get("seqs", 1)), kv_len=self.max_seq_len, phase=phase)

    def decode_splits(self, seqs: int) -> int:
        """The triton decode backend's splits of each (sequence, kv head) in a launch of `seqs` sequences."""
        want = max(1, DECODE_PROGRAMS // (seqs * self.num_kv_heads))
        return min(DECODE_MAX_SPLITS, 1 << (want.bit_length() - 1))

    def float_workspace(self, backend: str, shape: StepShape, num_sms: int, head_dim: int | None = None) -> Sized:
        if backend == "triton":
            n = self.decode_splits(shape.seqs)
            return Sized(4 * shape.seqs * self.num_qo_heads * n * (self.head_dim + 2),
                         f"4 B x {shape.seqs} seqs x {self.num_qo_heads} q heads x {n} splits x ({self.head_dim} "
                         f"dims + max + sum): each split's fp32 partial")
        if backend not in USES_FLOAT_WORKSPACE:
            return Sized(0, f"{backend} keeps no split-KV partials in the float workspace")
        if shape.phase == "decode":
            return fis.fa2_decode_float_workspace(self.num_qo_heads, self.num_kv_heads, self.head_dim, num_sms)
        return fis.fa2_prefill_float_workspace(shape.rows, shape.seqs, self.num_qo_heads, self.num_kv_heads,
                                               self.head_dim, num_sms)

    def wrapper_allocs(self, backend: str, shape: StepShape) -> list[tuple[str, int]]:
        """Fixed buffers of one captured wrapper: int workspace, indptrs, page indices, last-page lengths."""
        if backend == "torch":
            return []
        max_pages = shape.seqs * self.pages_for(shape.kv_len)
        if backend == "triton":       # page table and lengths, and a count of the splits done per kv head
            return [("kv_indptr", 4 * (shape.seqs + 1)), ("kv_indices", 4 * max_pages),
                    ("kv_last_page_len", 4 * shape.seqs), ("split_counts", 4 * shape.seqs * self.num_kv_heads)]
        bufs = [("int_workspace", self.int_workspace_bytes)]
        # decode needs no qo_indptr of ours; FlashInfer's decode wrapper keeps one on tensor cores only
        if shape.phase != "decode" or tensor_core_decode(backend, self.num_qo_heads, self.num_kv_heads):
            bufs.append(("qo_indptr", 4 * (shape.seqs + 1)))
        bufs += [("kv_indptr", 4 * (shape.seqs + 1)), ("kv_indices", 4 * max_pages),
                 ("kv_last_page_len", 4 * shape.seqs), ("append_indices", 8 * shape.rows)]
        if shape.phase != "decode":   # FlashInfer's paged prefill wrapper keeps a kv_lens buffer of its own
            bufs.append(("kv_lens", fis.PREFILL_KV_LENS_BYTES))
        return bufs

    def fake(self, shape: StepShape, run_head_dim: int | None = None) -> "FakePaged":
        return FakePaged(self, run_head_dim)


class FakePaged:
    """The simulation's stand-in: the append writes in place; attention returns one new tensor. A call whose
    heads or layer are not the resource's is refused: the pages, the kernels and their workspaces are sized by
    the resource (a head dim a kernel lacks may come zero-padded to run_head_dim)."""

    def __init__(self, spec: PagedKVSpec, run_head_dim: int | None = None):
        self.spec, self.dims = spec, {spec.head_dim, run_head_dim or spec.head_dim}

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = self.spec
        widths = {q.shape[-1], k.shape[-1], v.shape[-1]}
        if (q.shape[-2], k.shape[-2], v.shape[-2]) != (s.num_qo_heads, s.num_kv_heads, s.num_kv_heads) \
                or len(widths) != 1 or not widths <= self.dims:
            raise InvalidInput(f"resource '{s.name}' is declared as {s.num_qo_heads} query and {s.num_kv_heads} "
                               f"key heads of {s.head_dim}, but its node calls it with q {list(q.shape)}, "
                               f"k {list(k.shape)} and v {list(v.shape)}",
                               "the resource's heads size its pages, its kernels and their workspaces",
                               f"set resources.{s.name}'s num_qo_heads, num_kv_heads and head_dim to the module's")
        if not 0 <= layer < s.num_layers:
            raise InvalidInput(f"resource '{s.name}' holds layers 0 to {s.num_layers - 1}, but its node calls "
                               f"layer {layer}",
                               "each layer's keys and values have pages of their own",
                               f"set resources.{s.name}.num_layers to the module's layer count")
        return q.new_empty(q.shape[:-1] + (v.shape[-1],))


@dataclass(frozen=True)
class PagedPlan:
    """What FlashInfer's paged wrappers and append read for one step (B sequences, T new rows)."""

    qo_indptr: list[int]         # [B + 1] new rows per sequence, cumulated
    kv_indptr: list[int]         # [B + 1] pages per sequence, cumulated
    kv_indices: list[int]        # [kv_indptr[-1]] each sequence's pages, in order
    kv_last_page_len: list[int]  # [B] tokens in each sequence's last page (0 when it has none)
    batch_indices: list[int]     # [T] the sequence of each new row
    positions: list[int]         # [T] its position in that sequence


def paged_plan(qo_lens: list[int], kv_lens: list[int], page_tables: list[list[int]], page_size: int) -> PagedPlan:
    """qo_lens[i] new rows of sequence i sit at the end of its kv_lens[i] positions (PagedTorch's
    contract); only the first ceil(kv / page_size) pages of each table are used."""
    qo_indptr, kv_indptr, indices, last, batch, positions = [0], [0], [], [], [], []
    for i, (q, kv, table) in enumerate(zip(qo_lens, kv_lens, page_tables, strict=True)):
        pages = -(-kv // page_size)
        if not 0 <= q <= kv or pages > len(table):
            raise ValueError(f"sequence {i} with {q} new rows of {kv} needs {pages} pages, has {len(table)}")
        qo_indptr.append(qo_indptr[-1] + q)
        kv_indptr.append(kv_indptr[-1] + pages)
        indices += table[:pages]
        last.append(kv - (pages - 1) * page_size if pages else 0)
        batch += [i] * q
        positions += range(kv - q, kv)
    return PagedPlan(qo_indptr, kv_indptr, indices, last, batch, positions)


class PageAllocator:
    """Free-list of pages with query/act pairs: can_allocate(n) before allocate(n). A page is given
    back once: freeing one that is not held (never handed out, already freed, out of range) is a
    bookkeeping bug and is refused before anything changes."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))
        self._held: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if not self.can_allocate(n):
            raise RuntimeError(f"asked for {n} pages with {len(self._free)} free; call can_allocate first")
        pages = [self._free.pop() for _ in range(n)]
        self._held.update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        bad = [p for p in pages if p not in self._held]
        if bad or len(set(pages)) != len(pages):
            raise RuntimeError(f"freeing pages {bad or sorted(p for p in set(pages) if pages.count(p) > 1)} that "
                               f"are not held (never allocated, already freed or listed twice) of {self.num_pages}")
        self._held.difference_update(pages)
        self._free.extend(reversed(pages))


def new_cache(spec: PagedKVSpec, num_pages: int, device: str | torch.device = "cpu") -> torch.Tensor:
    import torch

    dtype = getattr(torch, spec.dtype)
    return torch.zeros(spec.num_layers, num_pages, 2, spec.page_size, spec.num_kv_heads, spec.head_dim,
                       dtype=dtype, device=device)


class PagedTorch:
    """CPU backend: appends this step's K/V into pages, then causal SDPA per sequence.

    qo_lens[i] new rows of sequence i sit at the end of its kv_lens[i] positions; page_tables[i]
    lists its pages in order.
    """

    def __init__(self, spec: PagedKVSpec, cache: torch.Tensor, qo_lens: list[int], kv_lens: list[int],
                 page_tables: list[list[int]]):
        import torch

        for q, kv, table in zip(qo_lens, kv_lens, page_tables, strict=True):
            if not 0 <= q <= kv or spec.pages_for(kv) > len(table):
                raise ValueError(f"sequence with {q} new rows of {kv} needs {spec.pages_for(kv)} pages, has {len(table)}")
        self.spec, self.cache = spec, cache
        self.qo_lens, self.kv_lens, self.tables = qo_lens, kv_lens, page_tables
        ps = spec.page_size
        slots = []
        for q, kv, table in zip(qo_lens, kv_lens, page_tables):
            slots += [table[p // ps] * ps + p % ps for p in range(kv - q, kv)]
        self.slots = torch.tensor(slots, dtype=torch.long, device=cache.device)

    def _positions(self, kv: int, table: list[int]) -> torch.Tensor:
        import torch

        ps = self.spec.page_size
        return torch.tensor([table[p // ps] * ps + p % ps for p in range(kv)], dtype=torch.long,
                            device=self.cache.device)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q [T, Hq, D], k/v [T, Hkv, D]; cache[layer] [pages, 2, page, Hkv, D], written in place
        import torch
        import torch.nn.functional as F

        cache, ps = self.cache[layer], self.spec.page_size
        cache[self.slots // ps, 0, self.slots % ps] = k.to(cache.dtype)
        cache[self.slots // ps, 1, self.slots % ps] = v.to(cache.dtype)
        group = q.shape[1] // k.shape[1]
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        start = 0
        for qn, kv, table in zip(self.qo_lens, self.kv_lens, self.tables):
            if qn == 0:
                continue
            pos = self._positions(kv, table)
            ks = cache[pos // ps, 0, pos % ps].to(q.dtype).transpose(0, 1).repeat_interleave(group, 0)
            vs = cache[pos // ps, 1, pos % ps].to(q.dtype).transpose(0, 1).repeat_interleave(group, 0)
            qs = q[start:start + qn].transpose(0, 1)
            rows = torch.arange(kv - qn, kv, device=q.device)[:, None]
            mask = torch.arange(kv, device=q.device)[None, :] <= rows
            out[start:start + qn] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask).transpose(0, 1)
            start += qn
        return out
