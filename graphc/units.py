"""Byte arithmetic and formatting shared by passes, reports and the runtime."""
from __future__ import annotations

import math

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

# bytes per element of every dtype a declaration, a port or a resource may name
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "bool": 1, "uint8": 1}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(n: int, to: int) -> int:
    return ceil_div(n, to) * to


def fmt_bytes(n: int | float) -> str:
    """Human form for reports: 1.50 GiB, 12.0 MiB, 512 B (sign kept)."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{int(n)} B"


def parse_bytes(text: str | int) -> int:
    """'80GiB', '80 GB', '512MiB', '1e9' or an int -> bytes. GB is 10**9, GiB is 2**30."""
    if isinstance(text, int):
        return text
    s = str(text).strip().replace(" ", "").replace("_", "")
    units = {"TIB": 1 << 40, "GIB": GiB, "MIB": MiB, "KIB": KiB, "TB": 10**12, "GB": 10**9,
             "MB": 10**6, "KB": 10**3, "B": 1}
    upper = s.upper()
    num, mult = s, 1
    for suffix, m in units.items():
        if upper.endswith(suffix):
            num, mult = s[: -len(suffix)], m
            break
    x = float(num) * mult
    if not math.isfinite(x):           # int() of inf raises OverflowError, not ValueError
        raise ValueError(f"'{text}' is not a finite size")
    return int(x)
