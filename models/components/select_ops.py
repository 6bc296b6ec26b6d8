"""The fused sampler (select_triton.py) as a torch operator, as norm_ops.py does for the norm kernels: capture
and the compiler's simulation see one launch (its output allocated by the caller with torch.empty, which the
simulation records). Triton is imported only when it runs on a device.

    graphc::select_codes(logits, sampled, temperature, kth, floor, penalty?, log_noise, seen?, suppress?, out!,
                         embed?, embed_out!?, pdl)

fused_select is talker.select with the same arguments and result, taking its RowParams duck-typed (sampled
[S] bool, temperature [S, 1] fp32, kth [S, 1] int64, floor [S, 1] fp32, penalty [S, 1] fp32 or None), so
talker.py can import it without a cycle. It equals the torch path but where top-p's cumulative probability
lies within a few ulp of its floor (select_triton.py says why). Given an embedding table and an output, the
same launch writes each code's row of the table there (the select_embed knob).
"""
from __future__ import annotations

import torch

MAX_V = 4096                   # a row lives in one program's registers


@torch.library.custom_op("graphc::select_codes", mutates_args=("out", "embed_out"))
def select_codes_op(logits: torch.Tensor, sampled: torch.Tensor, temperature: torch.Tensor, kth: torch.Tensor,
                    floor: torch.Tensor, penalty: torch.Tensor | None, log_noise: torch.Tensor,
                    seen: torch.Tensor | None, suppress: torch.Tensor | None, out: torch.Tensor,
                    embed: torch.Tensor | None = None, embed_out: torch.Tensor | None = None, pdl: bool = False
                    ) -> None:
    from models.components import select_triton as k

    k.select_codes(logits, sampled, temperature, kth, floor, penalty, log_noise, seen, suppress, out,
                   embed=embed, embed_out=embed_out, pdl=pdl)


@select_codes_op.register_fake
def _(logits, sampled, temperature, kth, floor, penalty, log_noise, seen, suppress, out, embed=None, embed_out=None,
      pdl=False) -> None:
    return None


def _cols(x: torch.Tensor) -> torch.Tensor:
    """x with contiguous columns (rows may stay strided): a copy only where they are not."""
    return x if x.stride(-1) == 1 else x.contiguous()


def fused_select(logits: torch.Tensor, rows, log_noise: torch.Tensor, seen: torch.Tensor | None = None,
                 suppress: torch.Tensor | None = None, embed: tuple[torch.Tensor, torch.Tensor] | None = None,
                 pdl: bool = False) -> torch.Tensor:
    """talker.select in one launch: logits [S, V] -> codes [S] int64, each row by its RowParams (rows), with
    log_noise [S, V] (log E), seen [S, V] bool (the penalty's ids; None: none), suppress [V] bool (None:
    none). V up to MAX_V. embed (table [>= V, H] contiguous, out [S, H] of its dtype, columns contiguous):
    out = table[codes] in the same launch. pdl: launched with programmatic dependent launch."""
    s, v = logits.shape
    _check_embed(embed, s, v)
    if tuple(log_noise.shape) != (s, v) or (seen is not None and tuple(seen.shape) != (s, v)) or (
            suppress is not None and tuple(suppress.shape) != (v,)) or v > MAX_V:
        raise ValueError(f"fused_select: logits {tuple(logits.shape)} (V <= {MAX_V}), log_noise "
                         f"{tuple(log_noise.shape)}, seen {None if seen is None else tuple(seen.shape)}, suppress "
                         f"{None if suppress is None else tuple(suppress.shape)} do not fit")
    if seen is not None and rows.penalty is None:
        raise ValueError("fused_select: seen needs RowParams with a repetition penalty column")
    out = torch.empty(s, device=logits.device, dtype=torch.int64)
    # per-row parameters are read at their first stride ([S] or [S, 1]); .float() and .long() copy nothing
    # where the dtype already is
    select_codes_op(_cols(logits), rows.sampled, rows.temperature.float(), rows.kth.long(), rows.floor.float(),
                    None if seen is None else rows.penalty.float(), _cols(log_noise),
                    None if seen is None else _cols(seen), None if suppress is None else _cols(suppress), out,
                    *(embed or (None, None)), pdl)
    return out


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
