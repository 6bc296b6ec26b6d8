"""GPU backends over FlashInfer, with the call signatures of RaggedTorch and PagedTorch.

    backend = make_backend(spec, "fa3", workspace, captured=True, rung_shape=shape, cache=pool)
    backend.plan(...)             # host side, outside any captured region
    out = backend(q, k, v)        # ragged; paged: backend(layer, q, k, v) -- capturable

One backend per (resource, captured rung), or one for eager steps. A captured backend's wrapper
reads fixed buffers sized for its rung (graph_buffers: the ones spec.wrapper_allocs lists, plus
the paged append indices it does not); each plan() rewrites them in place, so one graph replays any
layout of the rung. The float workspace and the int workspace are passed in and shared by all of a
resource's captured wrappers: steps run one after another on one stream, each replay is planned right
before it (the plan's copy into the int workspace is ordered after the replays before it), and a
captured step holds one wrapper of each resource. An eager backend makes its own int workspace.

flashinfer is imported when a backend is built, never at import: planning needs no GPU.
"""
from __future__ import annotations

import importlib.util
import math

import torch
import torch.nn.functional as F

from resources.base import StepShape
from resources.capabilities import TABLE, tensor_core_decode
from resources.paged_kv import PagedKVSpec, PagedPlan, paged_plan
from resources.ragged_attention import RaggedAttentionSpec, check_cu


def _flashinfer():
    try:
        import flashinfer
    except ImportError as e:
        raise ImportError("the FlashInfer attention backends need the 'flashinfer-python' package "
                          "(pip install flashinfer-python; on the GPU machine: ../shared/gpu/pack.sh, "
                          "then source .gpu/enter.sh)") from e
    return flashinfer


def _check_backend(kind: str, backend: str) -> None:
    names = sorted({b for per in TABLE[kind].values() for b in per} - {"torch"})
    if backend not in names:
        raise ValueError(f"'{backend}' is not a FlashInfer {kind} backend ({', '.join(names)}); resolve 'auto' "
                         "with resources.capabilities.choose, and run 'torch' with RaggedTorch/PagedTorch")


def int_workspace(spec: RaggedAttentionSpec | PagedKVSpec, device: str | torch.device = "cuda") -> torch.Tensor:
    """The int workspace one wrapper plans into (tile and merge indices): spec.int_workspace_bytes."""
    return torch.empty(spec.int_workspace_bytes, dtype=torch.uint8, device=device)


def graph_buffers(spec: RaggedAttentionSpec | PagedKVSpec, rung: StepShape,
                  device: str | torch.device) -> dict[str, torch.Tensor]:
    """The fixed int32 buffers a captured wrapper reads, named as in spec.wrapper_allocs.

    Paged rungs add append_indices [2, rows] (each new row's sequence, then its position). A decode
    rung has no qo_indptr of ours: the decode wrapper keeps its own [seqs + 1] range when it runs on
    tensor cores (wrapper_allocs counts that one) and needs none otherwise.
    """
    def i32(*shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=torch.int32, device=device)

    indptr = rung.seqs + 1
    if isinstance(spec, RaggedAttentionSpec):
        return {"qo_indptr": i32(indptr), "kv_indptr": i32(indptr)}
    bufs = {"kv_indptr": i32(indptr), "kv_indices": i32(rung.seqs * spec.pages_for(rung.kv_len)),
            "kv_last_page_len": i32(rung.seqs), "append_indices": i32(2, rung.rows)}
    if rung.phase != "decode":
        bufs["qo_indptr"] = i32(indptr)
    return bufs


# ---------------------------------------------------------------- host-side plan arithmetic

def ragged_indptrs(cu_q: list[int], cu_k: list[int], rung: StepShape | None,
                   causal: bool) -> tuple[list[int], list[int]]:
    """FlashInfer's qo/kv indptrs for a ragged layout; for a captured rung, exactly rung.seqs
    segments whose queries end at rung.rows.

    The runtime leaves padding rows (past cu_q[-1]) in no segment, but a captured wrapper must
    see every row of its rung: its batch size and row count are fixed at the first plan. Without
    a causal mask the padding rows join the last segment as extra queries (its keys unchanged,
    so no real row's output moves); otherwise, with self-attention, they take a spare segment of
    their own. Unused segments are empty.
    """
    qo, kv = check_cu(cu_q, "cu_seqlens_q"), check_cu(cu_k, "cu_seqlens_k")
    if len(qo) != len(kv):
        raise ValueError(f"{len(qo) - 1} query segments but {len(kv) - 1} key segments")
    if rung is None:
        return qo, kv
    segs, pad, self_attention = len(qo) - 1, rung.rows - qo[-1], qo == kv
    if segs > rung.seqs or pad < 0:
        raise ValueError(f"{segs} segments over {qo[-1]} rows do not fit a rung of {rung.seqs} segments"
                         f" and {rung.rows} rows")
    if pad and segs and not causal:
        qo[-1] = rung.rows
    elif pad and segs < rung.seqs and self_attention:
        qo.append(rung.rows)
        kv.append(kv[-1] + pad)
    elif pad:
        raise ValueError(f"{pad} padding rows need a segment of their own and all {rung.seqs} are in use"
                         " (causal masks cannot share one)")
    spare = rung.seqs + 1 - len(qo)
    return qo + [qo[-1]] * spare, kv + [kv[-1]] * spare


def _i32(values) -> torch.Tensor:
    # host tensors: FlashInfer's planners read them on the CPU and copy them into the device buffers
    return torch.tensor(values, dtype=torch.int32)


# ---------------------------------------------------------------- backends

class RaggedFlashInfer:
    """RaggedAttentionSpec on BatchPrefillWithRaggedKVCacheWrapper.

    rung None: eager (FlashInfer copies each plan's indptrs to fresh device tensors); a rung:
    use_cuda_graph with fixed indptrs for that rung, so __call__ may be captured and replayed
    after any later plan of the same rung. A head dim the kernels lack runs zero-padded to run_head_dim:
    q, k and v come at the spec's head dim (padded copies are made here) or already padded to run_head_dim
    (models/components/vision.py writes them so); the output is the spec's head dim (a view of the padded
    one).
    """

    def __init__(self, spec: RaggedAttentionSpec, backend: str, workspace: torch.Tensor,
                 rung: StepShape | None = None, dtype: torch.dtype = torch.bfloat16, run_head_dim: int | None = None,
                 ints: torch.Tensor | None = None):
        _check_backend(spec.kind, backend)
        fi = _flashinfer()
        # a head dim the kernels lack runs zero-padded to one they take (the plan's run_head_dim)
        self.run_head_dim = run_head_dim or spec.head_dim
        if backend == "fa3" and not fi.utils.is_fa3_prefill_head_dim_supported(self.run_head_dim, self.run_head_dim):
            # refused here rather than after a minute of compiling kernels FlashInfer does not instantiate
            raise ValueError(f"fa3 has no prefill kernels for head_dim {self.run_head_dim} (FlashInfer's Hopper"
                             " kernels take 64, 128 or 256)")
        if backend == "cudnn" and importlib.util.find_spec("cudnn") is None:
            raise ImportError("the cudnn backend needs the cuDNN frontend package 'nvidia-cudnn-frontend'"
                              " (import name 'cudnn')")
        self.spec, self.backend, self.rung, self.dtype = spec, backend, rung, dtype
        self.buffers = graph_buffers(spec, rung, workspace.device) if rung is not None else {}
        self._wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=rung is not None, qo_indptr_buf=self.buffers.get("qo_indptr"),
            kv_indptr_buf=self.buffers.get("kv_indptr"), backend=backend)
        self._wrapper.reset_workspace_buffer(workspace, ints if ints is not None else int_workspace(spec, workspace.device))
        self._rows: int | None = None     # query rows the plan covers
        self._keys: int | None = None     # key rows it reads (None: all, as captured runs must)

    def _cudnn_bounds(self) -> dict[str, int]:
        # cuDNN builds its graph for the plan's longest segments; a captured one must keep the graph
        # it was captured with, so every plan of the rung declares the rung's bound instead
        if self.backend != "cudnn" or self.rung is None:
            return {}
        return {"max_token_per_sequence": self.rung.rows, "max_sequence_kv": self.rung.rows}

    def plan(self, cu_seqlens_q: list[int], cu_seqlens_k: list[int] | None = None) -> None:
        cu_k = cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k
        qo, kv = ragged_indptrs(cu_seqlens_q, cu_k, self.rung, self.spec.causal)
        s = self.spec
        self._wrapper.plan(_i32(qo), _i32(kv), s.num_heads, s.kv_heads, self.run_head_dim, causal=s.causal,
                           window_left=s.window - 1 if s.window else -1, sm_scale=1 / math.sqrt(s.head_dim),
                           q_data_type=self.dtype, kv_data_type=self.dtype, **self._cudnn_bounds())
        self._rows, self._keys = qo[-1], kv[-1] if self.rung is None else None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q [Tq, Hq, D], k/v [Tk, Hkv, D] -> [Tq, Hq, Dv]; rows past the plan's (padding) stay unwritten
        if self._rows is None:
            raise RuntimeError("plan() the step's layout before calling the backend")
        d = self.spec.head_dim
        if q.shape[-1] != self.run_head_dim:   # the scale stays 1/sqrt(d); zero columns add nothing
            q, k, v = (F.pad(t, (0, self.run_head_dim - d)) for t in (q, k, v))
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        n, nk = self._rows, self._keys
        self._wrapper.run(q[:n], k[:nk], v[:nk], out=out[:n])
        return out if self.run_head_dim == d else out[..., :d]


class PagedFlashInfer:
    """PagedKVSpec on BatchPrefillWithPagedKVCacheWrapper (prefill and mixed steps) and
    BatchDecodeWithPagedKVCacheWrapper (steps of one row per sequence).

    rung None: eager, with both wrappers sharing one int workspace (each plan rewrites it and
    only the wrapper planned last runs). A rung: one use_cuda_graph wrapper, the decode one for
    a decode rung; every plan of that rung has exactly rung.seqs sequences and rung.rows rows.
    """

    def __init__(self, spec: PagedKVSpec, backend: str, workspace: torch.Tensor, cache: torch.Tensor,
                 rung: StepShape | None = None, dtype: torch.dtype = torch.bfloat16, decode_backend: str | None = None,
                 ints: torch.Tensor | None = None):
        _check_backend(spec.kind, backend)
        self._fi = _flashinfer()
        self.spec, self.backend, self.cache, self.rung, self.dtype = spec, backend, cache, rung, dtype
        self.decode_backend = decode_backend or backend
        # fa3 serves decode only through the tensor-core path; the CUDA-core kernel ignores the choice
        self.tensor_cores = tensor_core_decode(self.decode_backend, spec.num_qo_heads, spec.num_kv_heads)
        device = workspace.device
        self.buffers = graph_buffers(spec, rung, device) if rung is not None else {}
        ints = ints if ints is not None else int_workspace(spec, device)
        self._prefill = self._decode = self._active = None
        self._rows: int | None = None      # query rows the prefill plan covers (None: a decode plan)
        if rung is None or rung.phase != "decode":
            self._prefill = self._prefill_wrapper(workspace)
            self._prefill.reset_workspace_buffer(workspace, ints)
        # a 'triton' decode backend runs a rung's decode steps (PagedTriton); eager steps stay on FlashInfer's prefill
        if (rung is None and self.decode_backend != "triton") or (rung is not None and rung.phase == "decode"):
            self._decode = self._decode_wrapper(workspace)
            self._decode.reset_workspace_buffer(workspace, ints)
        self._append: tuple[torch.Tensor, ...] = ()

    def _prefill_wrapper(self, workspace: torch.Tensor):
        b = self.buffers
        return self._fi.BatchPrefillWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=self.rung is not None, qo_indptr_buf=b.get("qo_indptr"),
            paged_kv_indptr_buf=b.get("kv_indptr"), paged_kv_indices_buf=b.get("kv_indices"),
            paged_kv_last_page_len_buf=b.get("kv_last_page_len"), backend=self.backend)

    def _decode_wrapper(self, workspace: torch.Tensor):
        b = self.buffers
        return self._fi.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=self.rung is not None, use_tensor_cores=self.tensor_cores,
            paged_kv_indptr_buffer=b.get("kv_indptr"), paged_kv_indices_buffer=b.get("kv_indices"),
            paged_kv_last_page_len_buffer=b.get("kv_last_page_len"), backend=self.decode_backend)

    def _check_rung(self, qo_lens: list[int]) -> None:
        if len(qo_lens) != self.rung.seqs or sum(qo_lens) != self.rung.rows:
            raise ValueError(f"a captured rung takes exactly {self.rung.seqs} sequences and {self.rung.rows} rows,"
                             f" got {len(qo_lens)} and {sum(qo_lens)}: pad with sequences on a scratch page")
        if self.rung.phase == "decode" and any(q != 1 for q in qo_lens):
            raise ValueError("a decode rung takes one new row per sequence")

    def plan(self, qo_lens: list[int], kv_lens: list[int], page_tables: list[list[int]]) -> None:
        s = self.spec
        if self.rung is not None:
            self._check_rung(qo_lens)
        # a captured rung holds one wrapper; eager steps of one row per sequence take the decode one
        decode = self._decode is not None and (self._prefill is None or all(q == 1 for q in qo_lens))
        p = paged_plan(qo_lens, kv_lens, page_tables, s.page_size)
        indptr, indices, last = _i32(p.kv_indptr), _i32(p.kv_indices), _i32(p.kv_last_page_len)
        # FlashInfer copies host page indices into a captured rung's buffer with a blocking copy (a host sync
        # that would wait for the step in flight, graphc/runtime/flight.py); from the device it does not
        indices = indices.to(self.cache.device, non_blocking=True)
        common = dict(sm_scale=1 / math.sqrt(s.head_dim), q_data_type=self.dtype, kv_data_type=self.cache.dtype)
        if decode:
            self._decode.plan(indptr, indices, last, s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size,
                              **common)
        else:
            self._prefill.plan(_i32(p.qo_indptr), indptr, indices, last, s.num_qo_heads, s.num_kv_heads,
                               s.head_dim, s.page_size, causal=True, **common)
        self._active = self._decode if decode else self._prefill
        self._rows = None if decode else sum(qo_lens)
        self._append = self._append_tensors(p, indptr, indices, last)

    def _append_tensors(self, p: PagedPlan, indptr, indices, last) -> tuple[torch.Tensor, ...]:
        """(batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len) on the device."""
        rows = _i32([p.batch_indices, p.positions])   # [2, T]
        if self.rung is None:
            device = self.cache.device
            rows = rows.to(device, non_blocking=True)
            return (rows[0], rows[1], indices, indptr.to(device, non_blocking=True),
                    last.to(device, non_blocking=True))
        # the wrapper's plan has just filled the page buffers; the captured append reads them too
        b = self.buffers
        b["append_indices"].copy_(rows, non_blocking=True)
        return (b["append_indices"][0], b["append_indices"][1], b["kv_indices"], b["kv_indptr"],
                b["kv_last_page_len"])

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q [T, Hq, D], k/v [T, Hkv, D]; cache[layer] [pages, 2, page, Hkv, D] takes this step's k/v in place
        if self._active is None:
            raise RuntimeError("plan() the step's layout before calling the backend")
        cache = self.cache[layer]
        batch, positions, indices, indptr, last = self._append
        self._fi.append_paged_kv_cache(k.to(cache.dtype), v.to(cache.dtype), batch, positions, cache,
                                       indices, indptr, last, kv_layout="NHD")
        if self._rows == q.shape[0]:
            # the prefill wrapper's own output is torch.zeros (a fill of every row: 5.7 us a layer at 2,048 thinker
            # rows on the H200); its kernel writes each row the plan names, and the plan names all of q's
            return self._active.run(q, cache, out=torch.empty(q.shape, dtype=q.dtype, device=q.device))
        return self._active.run(q, cache)


def make_backend(spec: RaggedAttentionSpec | PagedKVSpec, backend: str, workspace: torch.Tensor, captured: bool,
                 rung_shape: StepShape | None, *, cache: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.bfloat16, decode_backend: str | None = None,
                 run_head_dim: int | None = None, ints: torch.Tensor | None = None, pdl: bool = False):
    """A backend for one resource: for a captured rung (rung_shape sizes its buffers) or eager. A ragged
    resource on 'triton' gets resources.ragged_triton.RaggedTriton (same calls, no workspace of its own).

    workspace: the resource's float workspace (zeroed once: FlashInfer's decode asks for that);
    cache: a paged resource's pool (resources.paged_kv.new_cache); dtype: q's (and ragged k/v's);
    ints: the resource's int workspace its captured wrappers share (int_workspace; None: one of its own);
    pdl: the Triton backends' launches with programmatic dependent launch (the node's pdl knob).
    """
    rung = rung_shape if captured else None
    if isinstance(spec, RaggedAttentionSpec) and backend == "triton":
        from resources.ragged_triton import RaggedTriton
        return RaggedTriton(spec, rung, workspace.device,
                            graph_buffers(spec, rung, workspace.device) if rung is not None else None, pdl)
    if isinstance(spec, RaggedAttentionSpec):
        return RaggedFlashInfer(spec, backend, workspace, rung, dtype, run_head_dim, ints)
    if isinstance(spec, PagedKVSpec):
        if cache is None:
            raise ValueError(f"paged resource '{spec.name}' needs its cache pool")
        if backend == "triton":
            from resources.paged_triton import PagedTriton
            return PagedTriton(spec, workspace, cache, rung, pdl)
        return PagedFlashInfer(spec, backend, workspace, cache, rung, dtype, decode_backend, ints)
    raise TypeError(f"{type(spec).__name__} has no FlashInfer backend")
