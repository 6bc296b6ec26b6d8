"""The fused MoE kernels (moe_triton.py) as torch operators, so that everything that sees aten ops sees
them: CUDA graph capture, and the compiler's simulation, which runs a step on meta tensors and counts
each operator that writes memory as one kernel launch (the `kernels` ledger line is calibrated per
launch). Each operator writes into buffers its caller allocated with torch.empty (the simulation
records those allocations) and returns nothing; on meta tensors it does nothing. Triton is imported
only when an operator runs on a device, so planning needs no GPU stack.

    graphc::moe_group(experts, rows!, ends!)                     pairs grouped by expert (few pairs)
    graphc::moe_count(experts, counts!)                          many pairs: each block's pairs per expert
    graphc::moe_place(experts, counts, rows!, ends!)             ... then each pair to its place by expert
    graphc::moe_gate_up(x, gate_up_proj, h!, rows, ends, top_k)  silu(gate) * up, by expert
    graphc::moe_down(h, down_proj, pairs!, rows, ends, weights)  down, scaled, to each pair's place
    graphc::moe_route(logits, experts!, weights!, norm)          the router: softmax, top-k, renormalised
    graphc::moe_sum_add(pairs, residual?, y!, weights?)          each token's k slots (scaled) summed, plus the residual
    graphc::moe_route_group(logits, experts!, weights!, rows!, ends!, norm)   the router and moe_group in one
                                                                 launch, for a decode step's few pairs
    graphc::moe_sum_add_norm(pairs, residual, norm_weight, y!, h!, eps, weights?, shared?, gate?)
                                                                 moe_sum_add (plus sigmoid(gate) * shared) and the
                                                                 next layer's input RMSNorm of its sum in one launch
    graphc::moe_place_tiles(experts, counts, rows!, tiles!, tile)  many pairs, SM90: each expert's pairs padded
                                                                 to whole tiles, and the tiles' maps
    graphc::moe_sm90_gate_up(x, w1, h!, rows, tiles, top_k)      FlashInfer's SM90 grouped GEMMs (moe_sm90.py)
    graphc::moe_sm90_down(h, w2, pairs!, rows, tiles, scales, top_k)
    graphc::moe_pair_gate_up(x, gate_up_proj, experts, h!, top_k)    a few tokens: silu(gate) * up, a program per
                                                                 (pair, columns), no grouping (moe_pairs_triton.py)
    graphc::moe_pair_down(h, down_proj, experts, weights, pairs!)    ... and down, scaled, in pair order
"""
from __future__ import annotations

import torch

from models.components.moe_sort import count_blocks


@torch.library.custom_op("graphc::moe_group", mutates_args=("rows", "ends"))
def moe_group(experts: torch.Tensor, rows: torch.Tensor, ends: torch.Tensor) -> None:
    from models.components import moe_triton as k

    k.group(experts, rows, ends)


@moe_group.register_fake
def _(experts, rows, ends) -> None:
    return None


@torch.library.custom_op("graphc::moe_count", mutates_args=("counts",))
def moe_count(experts: torch.Tensor, counts: torch.Tensor) -> None:
    from models.components import moe_triton as k

    k.count(experts, counts)


@moe_count.register_fake
def _(experts, counts) -> None:
    return None


@torch.library.custom_op("graphc::moe_place", mutates_args=("rows", "ends"))
def moe_place(experts: torch.Tensor, counts: torch.Tensor, rows: torch.Tensor, ends: torch.Tensor) -> None:
    from models.components import moe_triton as k

    k.place(experts, counts, rows, ends)


@moe_place.register_fake
def _(experts, counts, rows, ends) -> None:
    return None


@torch.library.custom_op("graphc::moe_place_tiles", mutates_args=("rows", "tiles"))
def moe_place_tiles(experts: torch.Tensor, counts: torch.Tensor, rows: torch.Tensor, tiles: torch.Tensor,
                    tile: int) -> None:
    from models.components import moe_triton as k

    k.place_tiles(experts, counts, rows, tiles, tile)


@moe_place_tiles.register_fake
def _(experts, counts, rows, tiles, tile) -> None:
    return None


@torch.library.custom_op("graphc::moe_gate_up", mutates_args=("h",))
def moe_gate_up(x: torch.Tensor, gate_up_proj: torch.Tensor, h: torch.Tensor, rows: torch.Tensor,
                ends: torch.Tensor, top_k: int, interleave: int = 0) -> None:
    from models.components import moe_triton as k

    k.gate_up(x, gate_up_proj, h, rows, ends, top_k, interleave)


@moe_gate_up.register_fake
def _(x, gate_up_proj, h, rows, ends, top_k, interleave=0) -> None:
    return None


@torch.library.custom_op("graphc::moe_sm90_gate_up", mutates_args=("h",))
def moe_sm90_gate_up(x: torch.Tensor, w1: torch.Tensor, h: torch.Tensor, rows: torch.Tensor, tiles: torch.Tensor,
                     top_k: int) -> None:
    from models.components import moe_sm90

    moe_sm90.gate_up(x, w1, h, rows, tiles, top_k)


@moe_sm90_gate_up.register_fake
def _(x, w1, h, rows, tiles, top_k) -> None:
    return None


@torch.library.custom_op("graphc::moe_sm90_down", mutates_args=("pairs",))
def moe_sm90_down(h: torch.Tensor, w2: torch.Tensor, pairs: torch.Tensor, rows: torch.Tensor, tiles: torch.Tensor,
                  scales: torch.Tensor, top_k: int) -> None:
    from models.components import moe_sm90

    moe_sm90.down(h, w2, pairs, rows, tiles, scales, top_k)


@moe_sm90_down.register_fake
def _(h, w2, pairs, rows, tiles, scales, top_k) -> None:
    return None


@torch.library.custom_op("graphc::moe_down", mutates_args=("pairs",))
def moe_down(h: torch.Tensor, down_proj: torch.Tensor, pairs: torch.Tensor, rows: torch.Tensor, ends: torch.Tensor,
             weights: torch.Tensor) -> None:
    from models.components import moe_triton as k

    k.down(h, down_proj, pairs, rows, ends, weights)


@moe_down.register_fake
def _(h, down_proj, pairs, rows, ends, weights) -> None:
    return None


@torch.library.custom_op("graphc::moe_pair_gate_up", mutates_args=("h",))
def moe_pair_gate_up(x: torch.Tensor, gate_up_proj: torch.Tensor, experts: torch.Tensor, h: torch.Tensor, top_k: int,
                     interleave: int = 0, pdl: bool = False) -> None:
    from models.components import moe_pairs_triton as k

    k.gate_up(x, gate_up_proj, experts, h, top_k, interleave, pdl)


@moe_pair_gate_up.register_fake
def _(x, gate_up_proj, experts, h, top_k, interleave=0, pdl=False) -> None:
    return None


@torch.library.custom_op("graphc::moe_pair_down", mutates_args=("pairs",))
def moe_pair_down(h: torch.Tensor, down_proj: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
                  pairs: torch.Tensor, pdl: bool = False) -> None:
    from models.components import moe_pairs_triton as k

    k.down(h, down_proj, experts, weights, pairs, pdl)


@moe_pair_down.register_fake
def _(h, down_proj, experts, weights, pairs, pdl=False) -> None:
    return None


@torch.library.custom_op("graphc::moe_route", mutates_args=("experts", "weights"))
def moe_route(logits: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, norm: bool, pdl: bool = False
              ) -> None:
    from models.components import moe_triton as k

    k.route(logits, experts, weights, norm, pdl)


@moe_route.register_fake
def _(logits, experts, weights, norm, pdl=False) -> None:
    return None


@torch.library.custom_op("graphc::moe_sum_add", mutates_args=("y",))
def moe_sum_add(pairs: torch.Tensor, residual: torch.Tensor | None, y: torch.Tensor,
                weights: torch.Tensor | None = None, pdl: bool = False) -> None:
    from models.components import moe_triton as k

    k.sum_add(pairs, residual, y, weights, pdl)


@moe_sum_add.register_fake
def _(pairs, residual, y, weights=None, pdl=False) -> None:
    return None


@torch.library.custom_op("graphc::moe_route_group", mutates_args=("experts", "weights", "rows", "ends"))
def moe_route_group(logits: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, rows: torch.Tensor,
                    ends: torch.Tensor, norm: bool, pdl: bool = False) -> None:
    from models.components import moe_edges_triton as k

    k.route_group(logits, experts, weights, rows, ends, norm, pdl)


@moe_route_group.register_fake
def _(logits, experts, weights, rows, ends, norm, pdl=False) -> None:
    return None


@torch.library.custom_op("graphc::moe_sum_add_norm", mutates_args=("y", "h"))
def moe_sum_add_norm(pairs: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, y: torch.Tensor,
                     h: torch.Tensor, eps: float, weights: torch.Tensor | None = None,
                     shared: torch.Tensor | None = None, gate: torch.Tensor | None = None, pdl: bool = False) -> None:
    from models.components import moe_edges_triton as k

    k.sum_add_norm(pairs, residual, norm_weight, y, h, eps, weights, pdl, shared, gate)


@moe_sum_add_norm.register_fake
def _(pairs, residual, norm_weight, y, h, eps, weights=None, shared=None, gate=None, pdl=False) -> None:
    return None


def fused_route(logits: torch.Tensor, top_k: int, norm: bool, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseMoE.route's contract from the router's logits [T, E]: (experts [T, k] int64, weights [T, k] in the
    logits' dtype), one launch where torch takes six (a cast, softmax, topk, a sum, a division, a cast)."""
    t, e = logits.shape
    if not 0 < top_k <= e:
        raise ValueError(f"fused_route: top {top_k} of {e} experts")
    experts = torch.empty(t, top_k, device=logits.device, dtype=torch.int64)
    weights = torch.empty(t, top_k, device=logits.device, dtype=logits.dtype)
    moe_route(logits if logits.stride(-1) == 1 else logits.contiguous(), experts, weights, norm, pdl)
    return experts, weights


# token-expert pairs moe_route_group takes (T * k): one program routes every token and groups the pairs
ROUTE_GROUP_PAIRS = 64
# the widest row moe_sum_add_norm takes: one program holds a token's row
SUM_NORM_WIDTH = 16384


def fused_route_group(logits: torch.Tensor, top_k: int, norm: bool, pdl: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """fused_route's (experts, weights) and the pairs grouped by expert as fused_experts groups them (rows [T k],
    ends [E] int32), in one launch; for T k <= ROUTE_GROUP_PAIRS."""
    t, e = logits.shape
    if not 0 < top_k <= e or t * top_k > ROUTE_GROUP_PAIRS:
        raise ValueError(f"fused_route_group: top {top_k} of {e} experts for {t} tokens (at most "
                         f"{ROUTE_GROUP_PAIRS} pairs)")
    experts = torch.empty(t, top_k, device=logits.device, dtype=torch.int64)
    weights = torch.empty(t, top_k, device=logits.device, dtype=logits.dtype)
    rows = torch.empty(t * top_k, device=logits.device, dtype=torch.int32)
    ends = torch.empty(e, device=logits.device, dtype=torch.int32)
    moe_route_group(logits if logits.stride(-1) == 1 else logits.contiguous(), experts, weights, rows, ends, norm,
                    pdl)
    return experts, weights, (rows, ends)


# more token-expert pairs than this are grouped by the counting sort (moe_count, moe_place: two launches whose
# work grows as the pairs; moe_group's one grows as the pairs squared: examples/bench/bench_moe.py --sweep)
GROUP_SORT_FROM = 512


def fused_experts(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, experts: torch.Tensor,
                  weights: torch.Tensor, residual: torch.Tensor | None = None, interleave: int = 0,
                  sm90_from: int = 0, grouped: tuple[torch.Tensor, torch.Tensor] | None = None,
                  pair_tokens: int = 0, pdl: bool = False) -> torch.Tensor:
    """Experts.forward's contract: x [T, H], gate_up_proj [E, 2I, H] (gate rows then up rows, or up and gate
    `interleave` rows at a time), down_proj [E, H, I], experts and weights [T, k] -> [T, H] in x's dtype (plus
    residual [T, H] where given: the decoder layer's add, in the same launch as the slots' sum); three operators
    and a sum, static shapes for a given T. Steps of sm90_from tokens or more (0: none) run the two GEMMs in
    FlashInfer's SM90 kernels (moe_sm90.py; gate_up_proj interleaved as they read it). grouped: the pairs
    already grouped by expert (fused_route_group's rows and ends), for a step below sm90_from. Steps of at most
    pair_tokens tokens run a program per token-expert pair and no grouping (moe_pairs_triton.py). pdl: those
    steps' launches and the slots' sum with programmatic dependent launch (resources/pdl.py)."""
    return _experts(x, gate_up_proj, down_proj, experts, weights, residual, interleave, sm90_from, grouped,
                    pair_tokens=pair_tokens, pdl=pdl)[0]


def fused_experts_norm(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, experts: torch.Tensor,
                       weights: torch.Tensor, residual: torch.Tensor, norm: tuple[torch.Tensor, float],
                       interleave: int = 0, sm90_from: int = 0,
                       grouped: tuple[torch.Tensor, torch.Tensor] | None = None, pair_tokens: int = 0,
                       pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """fused_experts with the residual, and the next decoder layer's input RMSNorm (norm: its weight [H] in x's
    dtype, and eps) of the result in the slots' sum's launch: (y, rms_norm(y) * weight). norm may carry a gated
    shared expert's output too, (weight, eps, shared [T, H], gate [T, 1]): the slots' sum then adds
    sigmoid(gate) * shared (SparseMoE's order) in the same launch."""
    t, width = x.shape
    if norm[0].shape != (width,) or norm[0].dtype != x.dtype or width > SUM_NORM_WIDTH:
        raise ValueError(f"fused_experts_norm: a norm weight {tuple(norm[0].shape)} {norm[0].dtype} for rows "
                         f"{tuple(x.shape)} {x.dtype}: want [{width}] in the rows' dtype, at most "
                         f"{SUM_NORM_WIDTH} wide")
    if len(norm) == 4 and (norm[2].shape != (t, width) or norm[3].shape != (t, 1) or norm[2].stride(-1) != 1
                           or not norm[3].is_contiguous() or {norm[2].dtype, norm[3].dtype} != {x.dtype}):
        raise ValueError(f"fused_experts_norm: a shared expert's rows {tuple(norm[2].shape)} and gate logits "
                         f"{tuple(norm[3].shape)} for rows {tuple(x.shape)}: want [{t}, {width}] (columns contiguous) "
                         f"and [{t}, 1] (contiguous), in the rows' dtype {x.dtype}")
    return _experts(x, gate_up_proj, down_proj, experts, weights, residual, interleave, sm90_from, grouped, norm,
                    pair_tokens, pdl)


def _experts(x, gate_up_proj, down_proj, experts, weights, residual, interleave, sm90_from, grouped, norm=None,
             pair_tokens=0, pdl=False) -> tuple[torch.Tensor, torch.Tensor | None]:
    t, k = experts.shape
    num_experts, two_i, hidden = gate_up_proj.shape
    if x.shape != (t, hidden) or down_proj.shape != (num_experts, hidden, two_i // 2):
        raise ValueError(f"fused_experts: x {tuple(x.shape)}, gate_up {tuple(gate_up_proj.shape)}, down "
                         f"{tuple(down_proj.shape)} do not agree")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(-1) != 1):
        raise ValueError(f"fused_experts: residual {tuple(residual.shape)} {residual.dtype} must be x's "
                         f"{tuple(x.shape)} {x.dtype}, columns contiguous")
    flat = experts.reshape(-1).contiguous()
    if sm90_from and t >= sm90_from:
        return _sm90_experts(x, gate_up_proj, down_proj, flat, weights, residual, interleave, norm)
    if t <= pair_tokens:
        return _pair_experts(x, gate_up_proj, down_proj, flat, weights, residual, interleave, norm, pdl)
    rows, ends = grouped if grouped is not None else _group(flat, num_experts)
    h = torch.empty(t * k, two_i // 2, device=x.device, dtype=x.dtype)      # in grouped order
    moe_gate_up(x.contiguous(), gate_up_proj, h, rows, ends, k, interleave)
    pairs = torch.empty(t * k, hidden, device=x.device, dtype=x.dtype)  # in (token, slot) order
    moe_down(h, down_proj, pairs, rows, ends, weights.reshape(-1).contiguous())
    if residual is None:
        return pairs.view(t, k, hidden).sum(dim=1), None
    return _sum_slots(pairs.view(t, k, hidden), x, residual, None, norm, pdl)


def _pair_experts(x, gate_up_proj, down_proj, flat, weights, residual, interleave, norm, pdl
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fused_experts a pair at a time: gate_up, down (scaled), the slots' sum (with the residual, and the norm
    where asked): three launches, no grouping."""
    t, k = weights.shape
    hidden, inter = down_proj.shape[1:]
    h = torch.empty(t * k, inter, device=x.device, dtype=x.dtype)                 # pair order
    moe_pair_gate_up(x.contiguous(), gate_up_proj, flat, h, k, interleave, pdl)
    pairs = torch.empty(t * k, hidden, device=x.device, dtype=x.dtype)
    moe_pair_down(h, down_proj, flat, weights.reshape(-1).contiguous(), pairs, pdl)
    return _sum_slots(pairs.view(t, k, hidden), x, residual, None, norm, pdl)


def _group(flat: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pairs grouped by expert: (rows [P] int32, ends [E] int32), one launch or the counting sort's two."""
    p = flat.numel()
    rows = torch.empty(p, device=flat.device, dtype=torch.int32)
    ends = torch.empty(num_experts, device=flat.device, dtype=torch.int32)
    if p > GROUP_SORT_FROM:
        counts = torch.empty(count_blocks(p)[1], num_experts, device=flat.device, dtype=torch.int32)
        moe_count(flat, counts)
        moe_place(flat, counts, rows, ends)
    else:
        moe_group(flat, rows, ends)
    return rows, ends


def _sum_slots(pairs: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None, weights: torch.Tensor | None,
               norm: tuple[torch.Tensor, float] | None, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(residual + the slots' sum [T, H], its norm or None): one launch (moe_sum_add, or moe_sum_add_norm)."""
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if norm is None:
        moe_sum_add(pairs, residual, y, weights, pdl)
        return y, None
    h = torch.empty_like(y)
    moe_sum_add_norm(pairs, residual, norm[0], y, h, norm[1], weights, *(norm[2:] or (None, None)), pdl)
    return y, h


def _sm90_experts(x, gate_up_proj, down_proj, flat, weights, residual, interleave, norm
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fused_experts on the SM90 grouped GEMMs: count, place into padded tiles, gate_up, down, the scaled sum
    (with the residual, and the norm where asked): five launches."""
    from models.components import moe_sm90

    t, k = weights.shape
    num_experts, two_i, hidden = gate_up_proj.shape
    if interleave != moe_sm90.INTERLEAVE and x.device.type != "meta":        # a trace has no rows to read
        raise ValueError(f"fused_experts: the SM90 kernels read gate_up_proj's up and gate rows interleaved "
                         f"{moe_sm90.INTERLEAVE} at a time, and these are laid out {interleave or 'gate then up'}: "
                         f"Experts.arrange_weights() puts them so after loading")
    n = moe_sm90.max_tiles(t * k, num_experts)
    counts = torch.empty(count_blocks(t * k)[1], num_experts, device=x.device, dtype=torch.int32)
    moe_count(flat, counts)
    rows = torch.empty(n * moe_sm90.TILE, device=x.device, dtype=torch.int32)    # padded grouped order
    tiles = torch.empty(2 * n + 1, device=x.device, dtype=torch.int32)
    moe_place_tiles(flat, counts, rows, tiles, moe_sm90.TILE)
    h = torch.empty(n * moe_sm90.TILE, two_i // 2, device=x.device, dtype=x.dtype)
    moe_sm90_gate_up(x.contiguous(), gate_up_proj, h, rows, tiles, k)
    pairs = torch.empty(t * k, hidden, device=x.device, dtype=x.dtype)         # (token, slot) order, unscaled
    scales = torch.empty(t, k, device=x.device, dtype=torch.float32)            # the kernel's contract; unread
    moe_sm90_down(h, down_proj, pairs, rows, tiles, scales, k)
    return _sum_slots(pairs.view(t, k, hidden), x, residual, weights.reshape(-1).contiguous(), norm)
