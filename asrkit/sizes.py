"""Memory sizes as people write them ('12GiB', '11.5G', '8000MB') and as we print them."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "kb": 10**3, "m": 2**20, "mib": 2**20,
          "mb": 10**6, "g": 2**30, "gib": 2**30, "gb": 10**9, "t": 2**40, "tib": 2**40,
          "tb": 10**12}  # fmt: skip


def parse_bytes(text: str) -> int:
    """'12GiB' / '12G' (binary), '12GB' (decimal), '1500MiB', '4096' (bytes)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = match and _UNITS.get(match.group(2).lower())
    if not unit:
        raise ValueError(f"not a memory size: {text!r} (e.g. 12GiB, 11.5G, 8000MB)")
    value = float(match.group(1)) * unit
    if value < 1:
        raise ValueError(f"not a memory size: {text!r} (must be positive)")
    return int(value)


def format_bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"
