"""The Gated DeltaNet core in plain torch over packed sequences: the causal depthwise conv that carries
each sequence's last kernel-1 rows, and the gated delta rule from each sequence's carried state, chunked for
prefill rows and token by token for decode rows. The math runs in fp32. This is the CPU path and the
reference the GPU kernels are held to.

The delta rule, per value head, with state S [dk, dv], decay alpha = exp(g) and rate beta:
    S_t = alpha_t S_{t-1} + k_t d_t^T,   d_t = beta_t (v_t - (alpha_t S_{t-1})^T k_t),   o_t = S_t^T q_t
The chunked form is the same recurrence solved for a chunk's d at once (see _chunk).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64     # rows per chunk of the chunked rule (FLA's and HF's)


def one_row(cu: list[int]) -> bool:
    """Every sequence of the step brings one row (decode): the one-row paths, with no per-sequence work on the
    host (a captured graph replays them)."""
    return len(cu) - 1 == cu[-1]


def read_slots(pool: torch.Tensor, slots: torch.Tensor, has_state: torch.Tensor) -> torch.Tensor:
    """pool[slots] ([N, ...]), zeros for the sequences without a state yet (whatever their slot holds)."""
    rows = pool.index_select(0, slots)
    keep = has_state.view(-1, *([1] * (rows.dim() - 1)))
    return torch.where(keep, rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


def causal_conv(x: torch.Tensor, weight: torch.Tensor, windows: torch.Tensor, cu: list[int]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """silu of the causal depthwise conv of each sequence's rows, its window giving the rows before them.

    x [T, C] (sequence i owns rows cu[i]:cu[i+1]), weight [C, K], windows [N, C, K-1] (oldest row first).
    Returns (y [T, C] in x's dtype, the new windows [N, C, K-1]: the last K-1 rows each sequence has seen).
    """
    if one_row(cu):
        ext = torch.cat([windows.to(x.dtype), x[:, :, None]], -1).float()            # [N, C, K]
        return F.silu((ext * weight.float()).sum(-1)).to(x.dtype), ext[:, :, 1:].to(x.dtype)
    taps, dev = weight.shape[1], x.device
    pieces, index, ends = [], [], []
    base = 0
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        pieces += [windows[i].transpose(0, 1).to(x.dtype), x[a:b]]                  # [K-1 + n, C]
        index.append(base + torch.arange(b - a, device=dev)[:, None] + torch.arange(taps, device=dev)[None, :])
        ends.append(base + (b - a) + torch.arange(taps - 1, device=dev))              # its last K-1 rows
        base += taps - 1 + b - a
    ext = torch.cat(pieces).float()                                                    # [T + N(K-1), C]
    y = (ext[torch.cat(index)] * weight.float().transpose(0, 1)).sum(1)               # [T, K, C] -> [T, C]
    new = ext[torch.cat(ends)].view(len(cu) - 1, taps - 1, -1).transpose(1, 2)
    return F.silu(y).to(x.dtype), new.to(x.dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def prepare_qk(q: torch.Tensor, k: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [T, HK, dk] -> fp32 [T, HV, dk]: unit length (q also scaled by dk^-0.5); value head h reads key
    head h // group."""
    q, k = l2norm(q.float()), l2norm(k.float())
    q = q * q.shape[-1] ** -0.5
    return q.repeat_interleave(group, 1), k.repeat_interleave(group, 1)


def _token(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
           s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One row of N sequences: q, k [N, H, dk], v [N, H, dv], g, beta [N, H], s [N, H, dk, dv]."""
    s = s * g.exp()[..., None, None]
    d = beta[..., None] * (v - torch.einsum("nhk,nhkv->nhv", k, s))
    s = s + k[..., :, None] * d[..., None, :]
    return torch.einsum("nhk,nhkv->nhv", q, s), s


def recurrent_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token, N sequences of T rows each: q, k [N, T, H, dk] (prepared), v [N, T, H, dv], g, beta
    [N, T, H], s [N, H, dk, dv] fp32. Returns (o [N, T, H, dv], the final state)."""
    out = []
    for t in range(q.shape[1]):
        o, s = _token(q[:, t], k[:, t], v[:, t].float(), g[:, t].float(), beta[:, t].float(), s)
        out.append(o)
    return torch.stack(out, 1), s


def _chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
           s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of c rows from state s [H, dk, dv]: q, k [H, c, dk], v [H, c, dv], g, beta [H, c].

    With gam_i the chunk's cumulative log decay up to row i and L_ij = exp(gam_i - gam_j) for j <= i (else 0):
    the rows' d solve (I + strict_lower(beta_i k_i.k_j L_ij)) D = beta V - beta e^gam K s; then
    O = (Q e^gam) s + (Q K^T * L) D and the state leaves the chunk as e^gam_c s + (K e^(gam_c - gam))^T D.
    """
    c = q.shape[1]
    gam = g.cumsum(-1)                                                                  # [H, c]
    below = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    decay = (gam[:, :, None] - gam[:, None, :]).masked_fill(~below, float("-inf")).exp()   # [H, c, c]
    kb = k * beta[..., None]
    system = (kb @ k.transpose(1, 2)) * decay
    rhs = beta[..., None] * v - (kb * gam.exp()[..., None]) @ s                       # [H, c, dv]
    d = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)  # reads below the diagonal
    o = (q * gam.exp()[..., None]) @ s + ((q @ k.transpose(1, 2)) * decay) @ d
    last = gam[:, -1:]                                                                  # [H, 1]
    s = s * last.exp()[..., None] + (k * (last - gam).exp()[..., None]).transpose(1, 2) @ d
    return o, s


def chunked_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 s: torch.Tensor, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence of T rows in chunks of `chunk` rows: q, k [T, H, dk] (prepared), v [T, H, dv], g, beta
    [T, H], s [H, dk, dv] fp32. Returns (o [T, H, dv], the final state)."""
    q, k, v = (t.transpose(0, 1).float() for t in (q, k, v))                          # [H, T, d]
    g, beta = g.transpose(0, 1).float(), beta.transpose(0, 1).float()                  # [H, T]
    out = []
    for a in range(0, q.shape[1], chunk):
        o, s = _chunk(q[:, a:a + chunk], k[:, a:a + chunk], v[:, a:a + chunk], g[:, a:a + chunk],
                      beta[:, a:a + chunk], s)
        out.append(o)
    return torch.cat(out, 1).transpose(0, 1), s


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     states: torch.Tensor, cu: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed sequences: q, k [T, H, dk] (prepared), v [T, H, dv], g, beta [T, H]; sequence i owns rows
    cu[i]:cu[i+1] and starts from states[i] ([N, H, dk, dv] fp32). One-row sequences (decode) run together
    through the recurrent rule, longer ones through the chunked rule. Returns (o [T, H, dv] fp32, new states)."""
    if one_row(cu):                             # all at once
        out, s = recurrent_rule(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], states)
        return out[:, 0], s
    o = torch.empty(q.shape[0], v.shape[1], v.shape[2], dtype=torch.float32, device=q.device)
    new = torch.empty_like(states)
    one = [i for i, (a, b) in enumerate(zip(cu, cu[1:])) if b - a == 1]
    if one:
        rows = torch.tensor([cu[i] for i in one], device=q.device)
        idx = torch.tensor(one, device=q.device)
        step = [t.index_select(0, rows)[:, None] for t in (q, k, v, g, beta)]     # [n, 1, ...]
        out, s = recurrent_rule(*step, states.index_select(0, idx))
        o[rows], new[idx] = out[:, 0], s
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        if b - a > 1:
            o[a:b], new[i] = chunked_rule(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], states[i])
    return o, new


def fla_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             states: torch.Tensor, cu: list[int], cu_t: tuple[torch.Tensor, torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """gated_delta_rule on flash-linear-attention's Triton kernels (fla-core), CUDA only: q, k [T, HK, dk] raw
    (FLA normalises them and scales q by dk^-0.5 in the kernel, and serves HV = group x HK value heads), v [T, HV,
    dv], g (log decay, fp32), beta [T, HV]; states [N, HV, dk, dv] fp32. A step of one-row sequences (decode)
    runs the fused recurrent kernel on them as a batch (no host work: a captured graph replays it), any other
    the chunked one over the packed sequences (its grid is sized on the host: eager only). Returns (o [T, HV,
    dv] in v's dtype as fla-core writes it, new states fp32): bf16 rows are not widened, the gated norm after
    the rule reads either dtype. cu_t: the step's offsets as int64 (on the host, on q's device), one pair for
    every layer of the step (StateStep.cu_tensors). FLA sizes its chunks from the host's copy, so no call waits
    for the GPU (given only the device's, it reads them back), and caches its chunk indices by the tensors'
    identity (a pair made per call, where cu_t is None, misses that cache)."""
    if q.is_meta:
        return fla_allocations(q, k, v, g, beta, states, cu)
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    if one_row(cu):                             # a batch of one-row sequences, no offsets
        o, s = fused_recurrent_gated_delta_rule(q[:, None], k[:, None], v[:, None], g=g[:, None].float(),
                                                beta=beta[:, None], initial_state=states, output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)
        return o[:, 0], s.float()
    host, dev = cu_t if cu_t is not None else (torch.tensor(cu, dtype=torch.long), None)
    dev = host.to(q.device, non_blocking=True) if dev is None else dev
    o, s = chunk_gated_delta_rule(q[None], k[None], v[None], g=g[None].float(), beta=beta[None], initial_state=states,
                                  output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=dev,
                                  cu_seqlens_cpu=host)
    return o[0], s.float()


def fla_allocations(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    states: torch.Tensor, cu: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """fla_rule on meta tensors, for the compiler's simulation: what fla-core 0.6.0's kernels allocate, in order
    and alive as long (read from its source: its input guard's contiguous copies of strided q, k and v; for
    decode, o like v and an fp32 final state; for the chunked rule, l2-normalised q and k with their fp32
    rstd, g's fp32 cumsum, A [T, HV, 64], w, u, h [NT, HV, dk, dv] over NT = the sequences' 64-row chunks,
    the final state, v_new and o; every temporary freed on return). Same returns as fla_rule."""
    n, hv, dk, dv = states.shape
    f32 = torch.float32
    if one_row(cu):
        copies = [x[:, None].contiguous() for x in (q, k, v)]
        o = torch.empty_like(copies[2])
        s = torch.empty(n, hv, dk, dv, dtype=f32, device=q.device)
        del copies
        return o[:, 0], s
    t, hk = q.shape[0], q.shape[1]
    chunks = sum(-(-(b - a) // CHUNK) for a, b in zip(cu, cu[1:]))
    temps = [x[None].contiguous() for x in (q, k, v)]
    for shape, dtype in (((t, hk, dk), q.dtype), ((t, hk), f32), ((t, hk, dk), k.dtype), ((t, hk), f32),
                         ((t, hv), f32), ((t, hv, CHUNK), k.dtype), ((t, hv, dk), k.dtype), ((t, hv, dv), v.dtype),
                         ((chunks, hv, dk, dv), k.dtype)):
        temps.append(torch.empty(1, *shape, dtype=dtype, device=q.device))
    s = torch.zeros(n, hv, dk, dv, dtype=f32, device=q.device)
    temps.append(torch.empty(1, t, hv, dv, dtype=v.dtype, device=q.device))       # v_new
    o = torch.empty(1, t, hv, dv, dtype=v.dtype, device=q.device)
    del temps
    return o[0], s
