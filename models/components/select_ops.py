"""The fused sampler (select_triton.py) as a torch operator, as norm_ops.py does for the norm kernels: capture
and the compiler's simulation see one launch (its output allocated by the caller with torch.empty, which the
simulation records). Triton is imported only when it runs on a device.

    graphc::select_codes(logits, sampled, temperature, kth, floor, penalty?, log_noise, seen?, suppress?, out!,
                         embed?, embed_out!?, pdl, raw)

fused_select is talker.select with the same arguments and result, taking its RowParams duck-typed (sampled
[S] bool, temperature [S, 1] fp32, kth [S, 1] int64, floor [S, 1] fp32, penalty [S, 1] fp32 or None), so
talker.py can import it without a cycle. It equals the torch path but where top-p's cumulative probability
lies within a few ulp of its floor (select_triton.py says why). Under the talker's select_fold knob it takes
RawRows (the sampling columns as the step's port holds them: RowParams' steps run in the program) and an
embedding table and output, where the same launch writes each code's row of the table.
"""
from __future__ import annotations

import torch

MAX_V = 4096                   # a row lives in one program's registers


class RawRows:
    """A step's sampling columns [S, 3 or 4] fp32 as the talker's port holds them (temperature, top_k, 1 - top_p,
    and code 0's repetition penalty), for the program to prepare as talker.RowParams does."""

    def __init__(self, params: torch.Tensor):
        if params.dim() != 2 or params.shape[1] not in (3, 4) or params.dtype != torch.float32:
            raise ValueError(f"RawRows: sampling columns {tuple(params.shape)} {params.dtype}; want [S, 3 or 4] "
                             "float32 (temperature, top_k, 1 - top_p, and code 0's repetition penalty)")
        self.params = params
        self.penalty = params[:, 3] if params.shape[1] > 3 else None


# No argument has a default: torch 2.11's dispatcher drops trailing arguments equal to their defaults before the
# ADInplaceOrView kernel, which then indexes the mutated embed_out past the end (IndexError) where it is None
# (tests/unit/test_custom_ops.py holds every graphc operator to this).
@torch.library.custom_op("graphc::select_codes", mutates_args=("out", "embed_out"))
def select_codes_op(logits: torch.Tensor, sampled: torch.Tensor, temperature: torch.Tensor, kth: torch.Tensor,
                    floor: torch.Tensor, penalty: torch.Tensor | None, log_noise: torch.Tensor,
                    seen: torch.Tensor | None, suppress: torch.Tensor | None, out: torch.Tensor,
                    embed: torch.Tensor | None, embed_out: torch.Tensor | None, pdl: bool, raw: bool) -> None:
    from models.components import select_triton as k

    k.select_codes(logits, sampled, temperature, kth, floor, penalty, log_noise, seen, suppress, out,
                   embed=embed, embed_out=embed_out, pdl=pdl, raw=raw)


@select_codes_op.register_fake
def _(logits, sampled, temperature, kth, floor, penalty, log_noise, seen, suppress, out, embed, embed_out, pdl,
      raw) -> None:
    return None


def _cols(x: torch.Tensor) -> torch.Tensor:
    """x with contiguous columns (rows may stay strided): a copy only where they are not."""
    return x if x.stride(-1) == 1 else x.contiguous()


def fused_select(logits: torch.Tensor, rows, log_noise: torch.Tensor, seen: torch.Tensor | None = None,
                 suppress: torch.Tensor | None = None, embed: tuple[torch.Tensor, torch.Tensor] | None = None,
                 pdl: bool = False) -> torch.Tensor:
    """talker.select in one launch: logits [S, V] -> codes [S] int64, each row by its RowParams (rows), with
    log_noise [S, V] (log E), seen [S, V] bool (the penalty's ids; None: none), suppress [V] bool (None:
    none). V up to MAX_V; rows may be RawRows. embed (table [>= V, H] contiguous, out [S, H] of its dtype,
    columns contiguous): out = table[codes] in the same launch. pdl: launched with programmatic dependent launch."""
    s, v = logits.shape
    _check_embed(embed, s, v)
    if tuple(log_noise.shape) != (s, v) or (seen is not None and tuple(seen.shape) != (s, v)) or (
            suppress is not None and tuple(suppress.shape) != (v,)) or v > MAX_V:
        raise ValueError(f"fused_select: logits {tuple(logits.shape)} (V <= {MAX_V}), log_noise "
                         f"{tuple(log_noise.shape)}, seen {None if seen is None else tuple(seen.shape)}, suppress "
                         f"{None if suppress is None else tuple(suppress.shape)} do not fit")
    if isinstance(rows, RawRows) and rows.params.shape[0] != s:
        raise ValueError(f"fused_select: {rows.params.shape[0]} rows of sampling columns for {s} rows of logits")
    if seen is not None and rows.penalty is None:
        raise ValueError("fused_select: seen needs RowParams with a repetition penalty column")
    out = torch.empty(s, device=logits.device, dtype=torch.int64)
    select_codes_op(_cols(logits), *_row_args(rows, seen is not None), _cols(log_noise),
                    None if seen is None else _cols(seen), None if suppress is None else _cols(suppress), out,
                    *(embed or (None, None)), pdl, isinstance(rows, RawRows))
    return out


def _row_args(rows, penalised: bool) -> tuple:
    """select_codes_op's sampled, temperature, kth, floor and penalty: RowParams' (read at their first stride,
    [S] or [S, 1]; .float() and .long() copy nothing where the dtype already is), or RawRows' columns."""
    if isinstance(rows, RawRows):
        p = rows.params
        return p[:, 0], p[:, 0], p[:, 1], p[:, 2], rows.penalty if penalised else None
    return (rows.sampled, rows.temperature.float(), rows.kth.long(), rows.floor.float(),
            rows.penalty.float() if penalised else None)


def _check_embed(embed: tuple[torch.Tensor, torch.Tensor] | None, s: int, v: int) -> None:
    """Refuse an embedding table or output fused_select cannot write through, saying which and why."""
    if embed is None:
        return
    table, out = embed
    if (table.dim() != 2 or table.shape[0] < v or not table.is_contiguous() or tuple(out.shape) != (s, table.shape[1])
            or out.dtype != table.dtype or out.stride(-1) != 1):
        raise ValueError(f"fused_select: embedding table {tuple(table.shape)} {table.dtype} (contiguous, at least "
                         f"{v} rows) and output {tuple(out.shape)} {out.dtype} stride {out.stride()} (want [{s}, "
                         f"H] of the table's dtype, columns contiguous) do not fit")
