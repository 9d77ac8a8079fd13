"""A dependency-free progress bar for long loops on stderr: on a terminal redrawn in place at
most 10 times a second; otherwise (a log file, a pipe) one plain line every 30 seconds and
one at the end, so a log never gets a single line of carriage returns."""

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
    terminal = sys.stderr.isatty()
    every = 0.1 if terminal else PLAIN_LINE_SECONDS
    start = last = time.monotonic()
    done = 0
    for item in items:
        yield item
        done += 1
        now = time.monotonic()
        if now - last >= every or (terminal and done == total):
            last = now
            _draw(label, done, total, now - start, terminal)
    if terminal and done != total:
        _draw(label, done, total, time.monotonic() - start, terminal)
    if terminal:
        sys.stderr.write("\n")
    else:
        _draw(label, done, total, time.monotonic() - start, terminal)


PLAIN_LINE_SECONDS = 30.0


def format_bar(done: int, total: int | None, elapsed: float, width: int = 30) -> str:
    """`[#####.....] done/total eta Ns` (or just `done` without a total)."""
    rate = done / elapsed if elapsed > 0 else 0.0
    if not total:
        return f"{done}"
    filled = min(int(width * done / total), width)
    eta = max(total - done, 0) / rate if rate > 0 else 0.0
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} eta {eta:5.0f}s"


def _draw(label: str, done: int, total: int | None, elapsed: float, terminal: bool) -> None:
    rate = done / elapsed if elapsed > 0 else 0.0
    if terminal:
        sys.stderr.write(f"\r{label} {format_bar(done, total, elapsed)} {rate:6.1f}/s")
    else:
        of = f"/{total}" if total else ""
        sys.stderr.write(f"{label} {done}{of} in {elapsed:.0f} s ({rate:.1f}/s)\n")
    sys.stderr.flush()
