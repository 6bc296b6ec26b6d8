"""FlashInfer's buffer sizes as formulas, transcribed from its planners (attention/scheduler.cuh).

The compiler uses these to size the float workspace a backend needs at a rung and the fixed
buffers each CUDA-graph-captured wrapper keeps. Every function returns a Sized with its arithmetic.
Constants that FlashInfer reads from the device at plan time (SM count, decode occupancy) come from
the target; the decode occupancy bound is the largest the kernel's 128-thread blocks allow.
"""
from __future__ import annotations

from graphc.units import MiB, ceil_div, round_up
from resources.base import Sized

# FlashInfer's default int workspace (wrappers are built with an 8 MiB int buffer each).
DEFAULT_INT_WORKSPACE = 8 * MiB
# Prefill planners assume two resident CTAs per SM (PrefillPlan: num_blocks_per_sm = 2).
PREFILL_BLOCKS_PER_SM = 2
# Decode: 2048 threads per SM / 128-thread blocks bounds the occupancy FlashInfer can measure.
DECODE_MAX_BLOCKS_PER_SM = 16
F32 = 4
# BatchPrefillWithPagedKVCacheWrapper allocates a 32768-entry int32 kv_lens buffer per wrapper.
PREFILL_KV_LENS_BYTES = 32768 * 4


def fa2_cta_tile_q(packed_qo_len: int, head_dim: int) -> int:
    """FA2DetermineCtaTileQ on sm_80+."""
    if packed_qo_len > 64 and head_dim < 256:
        return 128
    return 64 if packed_qo_len > 16 else 16


def fa2_prefill_float_workspace(rows: int, seqs: int, num_qo_heads: int, num_kv_heads: int,
                                head_dim: int, num_sms: int) -> Sized:
    """Split-KV partials of a captured FA2 prefill (PrefillPlan with enable_cuda_graph).

    Captured plans always split KV, so tmp_v and tmp_s are sized for the padded tile count; a tile
    packs `group` query heads per kv head, so the partials hold padded x tile / group rows of every
    query head (measured on the H200: 16.6 MiB for the thinker's rung, docs/gpu-attention.md).
    """
    gqa = num_qo_heads // num_kv_heads
    max_qo_len = (rows - seqs + 1) * gqa
    tile = fa2_cta_tile_q(max_qo_len, head_dim)
    tiles = ceil_div(rows * gqa, tile) + seqs - 1
    max_bs_if_split = PREFILL_BLOCKS_PER_SM * num_sms // num_kv_heads
    padded = max(max_bs_if_split, tiles)
    part_rows = ceil_div(padded * tile, gqa)
    tmp_v = round_up(num_qo_heads * part_rows * head_dim * F32, 16)
    tmp_s = round_up(num_qo_heads * part_rows * F32, 16)
    return Sized(tmp_v + tmp_s,
                 f"tmp_v {num_qo_heads} heads x {part_rows} rows ({padded} padded tiles x {tile} / group {gqa})"
                 f" x {head_dim} dims x 4 B + tmp_s {num_qo_heads} x {part_rows} x 4 B"
                 f" (tiles = ceil({rows} rows x {gqa} / {tile}) + {seqs} - 1 = {tiles};"
                 f" split bound = {PREFILL_BLOCKS_PER_SM} x {num_sms} SMs / {num_kv_heads} kv heads = {max_bs_if_split})")


def fa2_decode_float_workspace(num_qo_heads: int, num_kv_heads: int, head_dim: int,
                               num_sms: int) -> Sized:
    """Split-KV partials of a captured FA2 decode: padded batch = max grid / kv heads."""
    padded = DECODE_MAX_BLOCKS_PER_SM * num_sms // num_kv_heads
    tmp_v = round_up(num_qo_heads * padded * head_dim * F32, 16)
    tmp_s = round_up(num_qo_heads * padded * F32, 16)
    return Sized(tmp_v + tmp_s,
                 f"tmp_v {num_qo_heads} heads x {padded} padded rows x {head_dim} dims x 4 B + tmp_s"
                 f" (padded = {DECODE_MAX_BLOCKS_PER_SM} blocks/SM bound x {num_sms} SMs / {num_kv_heads} kv heads)")


def int_workspace_need(rows: int, seqs: int, padded_tiles: int) -> int:
    """Bytes PrefillPlan writes into the int workspace (indices, indptrs, merge indptr, mask)."""
    n = 3 * round_up(4 * padded_tiles, 16)          # request, qo tile, kv tile indices
    n += round_up(4 * (seqs + 1), 16) + 4 + 16      # o_indptr, kv chunk size, total rows
    n += round_up(4 * (rows + 1), 16) + round_up(padded_tiles, 16)  # merge indptr, valid mask
    return n
