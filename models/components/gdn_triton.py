"""A decode step of the gated delta rule on the state pool itself: one Triton launch per layer that reads each
sequence's recurrent state from its slot, advances it by the step's one row and writes it back in place.

The torch path of a captured decode step moves the state three times around the rule (gated_deltanet.core:
read_slots gathers [N, HV, dk, dv] out of the pool and zeroes the new sequences', the rule returns a new state,
index_copy_ scatters it back). On the H200 at 64 sequences those moves took about 6.8 of the 9B decode step's
19.4 ms, against 2.2 ms for fla-core's recurrent kernel (docs/benchmarks.md). Here each program owns one
(sequence, value head, block of BV value columns): its state block [dk, BV] is loaded from pool[slot] (zeros
where the sequence has no state yet), then, with the math of delta_rule.py's docstring,

    q, k <- l2norm(q), l2norm(k) (q also x dk^-0.5);  S <- exp(g) S;  d = beta (v - S^T k);  S <- S + k d^T;
    o = S^T q

and the block is stored back where it came from. q and k are the step's raw [N, HK, dk] rows (value head h
reads key head h // (HV / HK)), v [N, HV, dv], g (log decay) and beta [N, HV]; rows may be strided views of
the projection's output as long as their last dim is contiguous. The slot ids and has_state flags are the
step's static tensors, so a captured graph replays it with no host work.

Plans choose it with fla_gdn (graphc/passes/select_backends.py, the gdn_slots knob): on the H200 the 9B's decode
step takes 7.35 / 9.84 / 11.98 ms at 1 / 16 / 64 sequences against 7.75 / 12.58 / 19.33 without it
(docs/benchmarks.md). tests/unit/test_gdn_triton.py runs it under Triton's interpreter on CPU against the torch
rule; tests/gpu/test_gated_deltanet_gpu.py at the 9B's shapes on the GPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 32        # value columns a program owns


@triton.jit
def _slot_decode(q, k, v, g, beta, pool, slots, has_state, o, sqn, sqh, skn, skh, svn, svh, sps, sph, spk, scale,
                 HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                 BV: tl.constexpr):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    n, hv = i_nh // HV, i_nh % HV
    hk = hv // GROUP
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk, mv = ok < K, ov < V
    bq = tl.load(q + n * sqn + hk * sqh + ok, mask=mk, other=0.).to(tl.float32)
    bk = tl.load(k + n * skn + hk * skh + ok, mask=mk, other=0.).to(tl.float32)
    bq = bq * tl.rsqrt(tl.sum(bq * bq, 0) + 1e-6) * scale
    bk = bk * tl.rsqrt(tl.sum(bk * bk, 0) + 1e-6)
    bv = tl.load(v + n * svn + hv * svh + ov, mask=mv, other=0.).to(tl.float32)
    decay = tl.exp(tl.load(g + n * HV + hv).to(tl.float32))
    rate = tl.load(beta + n * HV + hv).to(tl.float32)
    slot = tl.load(slots + n).to(tl.int64)
    keep = tl.load(has_state + n).to(tl.int32)
    ptr = pool + slot * sps + hv * sph + ok[:, None] * spk + ov[None, :]
    m = mk[:, None] & mv[None, :]
    h = tl.load(ptr, mask=m, other=0.).to(tl.float32)
    h = tl.where(keep != 0, h, 0.) * decay
    d = rate * (bv - tl.sum(h * bk[:, None], 0))
    h = h + bk[:, None] * d[None, :]
    tl.store(ptr, h.to(pool.dtype.element_ty), mask=m)
    tl.store(o + (n * HV + hv) * V + ov, tl.sum(h * bq[:, None], 0), mask=mv)


def slot_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                pool: torch.Tensor, slots: torch.Tensor, has_state: torch.Tensor) -> torch.Tensor:
    """One row of each of N sequences through the gated delta rule, the state advanced in pool [slots, HV, dk,
    dv] (fp32) at slots [N] (int64; has_state [N] bool: False reads zeros). Returns o [N, HV, dv] fp32."""
    n, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1 or pool.stride(-1) != 1:
        raise ValueError("slot_decode reads rows whose last dim is contiguous")
    if hv % hk or g.shape != (n, hv) or beta.shape != (n, hv) or not g.is_contiguous() or not beta.is_contiguous():
        raise ValueError(f"slot_decode: {hv} value heads over {hk} key heads, g {tuple(g.shape)}, beta "
                         f"{tuple(beta.shape)}: want HV a multiple of HK and contiguous [N, HV] gates")
    o = torch.empty(n, hv, dv, dtype=torch.float32, device=q.device)
    bv = min(BLOCK_V, triton.next_power_of_2(dv))
    grid = (triton.cdiv(dv, bv), n * hv)
    _slot_decode[grid](q, k, v, g, beta, pool, slots, has_state, o, q.stride(0), q.stride(1), k.stride(0),
                       k.stride(1), v.stride(0), v.stride(1), pool.stride(0), pool.stride(1), pool.stride(2),
                       dk ** -0.5, HV=hv, GROUP=hv // hk, K=dk, V=dv, BK=triton.next_power_of_2(dk), BV=bv)
    return o
