"""The MoE experts' two grouped GEMMs for many tokens on sm_90 (issue 13): FlashInfer's CuTe-DSL kernels
(warp-specialised, persistent, B through TMA, 128-row tiles), in place of moe_triton's tiled ones.

    gate_up   gather each padded row's token from x, x W1 with W1's up and gate rows interleaved 32 at a
              time (Experts.gate_up_layout), silu(gate) * up in the epilogue, rounded once to h
    down      h W2 to each (token, slot) row of `pairs`, unscaled (the kernels' deterministic mode: no
              atomics); moe_sum_add then scales each slot's row by its routing weight in fp32, sums the k
              slots and adds the residual, rounding once each as the Triton path does

Both read the grouping moe_triton.place_tiles writes (each expert's pairs padded to whole TILE-row tiles;
the tiles' experts and ends; the tiles in use) from device memory, so a step captures as one CUDA graph
for any routing. Which token counts take them is the plan's `moe_sm90_from` knob (select_backends). The
kernels compile once a process (about a second each) on first use; FlashInfer imports them from
nvidia-cutlass-dsl, which flashinfer-python 0.7.2 depends on. No CPU path: meta tensors see the operators
(moe_ops), a GPU runs them, tests/gpu/test_moe_sm90_gpu.py compares them with an fp64 reference.

Measured on the H200, one thinker layer's two GEMMs at 2,048 tokens (examples/bench/bench_moe_sm90.py; the Triton
tiled kernels in brackets): routing of random logits 403 us (499), 8 experts favoured by +3 in their logits
505 (493), by +6 270 (348); the tactics below were the best or within 1% at each.
"""
from __future__ import annotations

import torch

TILE = 128                      # rows of one expert's pairs a tile (the kernels' M tile; moe_triton.place_tiles)
INTERLEAVE = 32                 # gate_up_proj's up and gate rows alternate this many at a time
GEMM1 = ((TILE, 256), 1)        # gate_up's CTA tile (M, N over up+gate columns) and its walk's swizzle
GEMM2 = ((TILE, 256), (1, 1), False)    # down's CTA tile, cluster and raster (N-fast)
PDL = True                      # programmatic dependent launch: a kernel's prologue overlaps the previous one


def max_tiles(pairs: int, num_experts: int) -> int:
    """The most TILE-row tiles `pairs` token-expert pairs can need over num_experts experts (each expert's
    group padded to whole tiles; the worst case is every expert but one holding a single pair)."""
    if pairs <= num_experts:
        return pairs
    return (pairs + (TILE - 1) * num_experts) // TILE


def _maps(rows: torch.Tensor, tiles: torch.Tensor):
    n = (tiles.numel() - 1) // 2
    if tiles.numel() != 2 * n + 1 or rows.numel() != n * TILE:
        raise ValueError(f"moe_sm90: rows {rows.numel()} and tiles {tiles.numel()} are not [max_tiles * {TILE}] "
                         f"and [2 max_tiles + 1]")
    return tiles[:n], tiles[n:2 * n], tiles[2 * n:]


def gate_up(x: torch.Tensor, w1: torch.Tensor, h: torch.Tensor, rows: torch.Tensor, tiles: torch.Tensor,
            top_k: int) -> None:
    """h [max_tiles * TILE, I] (padded grouped order; padding rows hold garbage) = silu(x W_gate) * (x W_up)
    of each pair's token and expert; w1 [E, 2I, H] interleaved (Experts.gate_up_layout = INTERLEAVE)."""
    from flashinfer.fused_moe.cute_dsl.sm90_contiguous_gather_grouped_gemm_act_fusion import (
        sm90_contiguous_gather_grouped_gemm_act_fusion)
    experts, limits, used = _maps(rows, tiles)
    sm90_contiguous_gather_grouped_gemm_act_fusion(
        x, w1, experts, limits, rows, used, out=h, topk=top_k, permuted_m=rows.numel(), tile_shape_mn=GEMM1[0],
        swizzle_size=GEMM1[1], enable_pdl=PDL)


def down(h: torch.Tensor, w2: torch.Tensor, pairs: torch.Tensor, rows: torch.Tensor, tiles: torch.Tensor,
         scales: torch.Tensor, top_k: int) -> None:
    """pairs [T * k, H] ((token, slot) order) = h W_down of each pair, unscaled. scales [T, k] fp32 is the
    kernel's contract (it reads it only in its atomic mode, not used here)."""
    from flashinfer.fused_moe.cute_dsl.sm90_contiguous_grouped_gemm_finalize_fusion import (
        sm90_contiguous_grouped_gemm_finalize_fusion)
    experts, limits, used = _maps(rows, tiles)
    sm90_contiguous_grouped_gemm_finalize_fusion(
        h, w2, experts, limits, rows, used, scales, pairs, topk=top_k, use_fused_finalize=False,
        tile_shape_mn=GEMM2[0], cluster_shape_mn=GEMM2[1], raster_along_m=GEMM2[2], enable_pdl=PDL)


def available() -> str | None:
    """None where the kernels can run here, else why not (for boot's refusal)."""
    try:
        import flashinfer.fused_moe.cute_dsl.sm90_contiguous_gather_grouped_gemm_act_fusion  # noqa: F401
        import flashinfer.fused_moe.cute_dsl.sm90_contiguous_grouped_gemm_finalize_fusion  # noqa: F401
    except Exception as exc:            # ImportError, or the DSL's own failure to load its libraries
        return f"{type(exc).__name__}: {exc}"
    return None


def interleave(w: torch.Tensor, to: int) -> torch.Tensor:
    """One expert's gate_up_proj rows [2I, H] from gate-then-up into up and gate INTERLEAVE rows at a time
    (to = INTERLEAVE), or back (to = 0): a new tensor."""
    two_i, hidden = w.shape
    inter = two_i // 2
    if to:
        return torch.stack((w[inter:].reshape(-1, to, hidden), w[:inter].reshape(-1, to, hidden)),
                           dim=1).reshape(two_i, hidden)
    v = w.reshape(-1, 2, INTERLEAVE, hidden)
    return torch.cat((v[:, 1].reshape(inter, hidden), v[:, 0].reshape(inter, hidden)), 0)
