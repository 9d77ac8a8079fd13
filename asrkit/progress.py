"""A dependency-free progress bar for long loops (stderr, redrawn at most 10 times a second)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(
    items: Iterable[T], total: int | None = None, label: str = "", enabled: bool = True
) -> Iterator[T]:
    if not enabled:
        yield from items
        return
    start = last = time.monotonic()
    done = 0
    for item in items:
        yield item
        done += 1
        now = time.monotonic()
        if now - last >= 0.1 or done == total:
            last = now
            _draw(label, done, total, now - start)
    if done != total:
        _draw(label, done, total, time.monotonic() - start)
    sys.stderr.write("\n")


def format_bar(done: int, total: int | None, elapsed: float, width: int = 30) -> str:
    """`[#####.....] done/total eta Ns` (or just `done` without a total)."""
    rate = done / elapsed if elapsed > 0 else 0.0
    if not total:
        return f"{done}"
    filled = min(int(width * done / total), width)
    eta = max(total - done, 0) / rate if rate > 0 else 0.0
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} eta {eta:5.0f}s"


def _draw(label: str, done: int, total: int | None, elapsed: float) -> None:
    rate = done / elapsed if elapsed > 0 else 0.0
    sys.stderr.write(f"\r{label} {format_bar(done, total, elapsed)} {rate:6.1f}/s")
    sys.stderr.flush()
