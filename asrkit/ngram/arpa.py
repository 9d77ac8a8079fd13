"""The ARPA back-off LM format: read (every mistake named by file and line) and written.

A file is a `\\data\\` header of `ngram N=count` lines, then one `\\N-grams:` section per
order, each line `log10-prob<TAB>w1 ... wN[<TAB>log10-back-off]`, then `\\end\\`. Fields
are separated by spaces or tabs, and lines by newlines, only: a word may be any other
character (NeMo's token LMs write token 33 as U+0085, which Python counts as a line break
and as whitespace).
"""

from __future__ import annotations

import gzip
import math
import re
from pathlib import Path

from asrkit.errors import InputError
from asrkit.ngram.model import NEVER, NGramLM

_COUNT = re.compile(r"ngram\s+(\d+)\s*=\s*(\d+)$")
_SECTION = re.compile(r"\\(\d+)-grams:$")
_FIELDS = re.compile(r"[ \t]+")


def read_arpa(path: str | Path, option: str = "--lm") -> NGramLM:
    """An ARPA file (plain or .gz) as an `NGramLM`."""
    path = Path(path)
    where = f"{option} {path}"
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8", newline="\n") as f:
            lines = [line.rstrip("\r") for line in f.read().split("\n")]
    except FileNotFoundError:
        raise InputError(f"{where}: no such file") from None
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise InputError(f"{where}: not an ARPA text file ({err})") from None
    number = 0
    while number < len(lines) and lines[number].strip(" \t") != "\\data\\":
        number += 1
    if number == len(lines):
        raise InputError(f"{where}: no \\data\\ line: not an ARPA language model")
    counts: dict[int, int] = {}
    number += 1
    while number < len(lines) and not lines[number].strip(" \t").startswith("\\"):
        line = lines[number].strip(" \t")
        number += 1
        if not line:
            continue
        match = _COUNT.match(line)
        if not match:
            raise InputError(f"{where}:{number}: expected 'ngram N=count', found {line[:60]!r}")
        counts[int(match[1])] = int(match[2])
    order = max(counts, default=0)
    if not counts or sorted(counts) != list(range(1, order + 1)):
        raise InputError(
            f"{where}: the \\data\\ header must count orders 1 to N, found {sorted(counts)}"
        )
    probs: dict[tuple[str, ...], float] = {}
    backoffs: dict[tuple[str, ...], float] = {}
    for n in range(1, order + 1):
        while number < len(lines) and not lines[number].strip(" \t"):
            number += 1
        header = lines[number].strip(" \t") if number < len(lines) else "the end of the file"
        match = _SECTION.match(header)
        if not match or int(match[1]) != n:
            raise InputError(f"{where}:{number + 1}: expected \\{n}-grams:, found '{header[:60]}'")
        number += 1
        section = number
        found = 0
        while number < len(lines) and (line := lines[number].strip(" \t")) and line[0] != "\\":
            number += 1
            found += 1
            fields = _FIELDS.split(line)
            if len(fields) not in (n + 1, n + 2):
                raise InputError(
                    f"{where}:{number}: a {n}-gram line is a log10 probability, {n} word(s) "
                    f"and an optional back-off weight; found {len(fields)} field(s)"
                )
            prob = _log10(fields[0], where, number, "probability")
            ngram = tuple(fields[1 : n + 1])
            if ngram in probs:
                raise InputError(f"{where}:{number}: {' '.join(ngram)!r} listed twice")
            probs[ngram] = prob
            if len(fields) == n + 2:
                backoff = _log10(fields[-1], where, number, "back-off weight", bounded=False)
                if backoff != 0.0:
                    backoffs[ngram] = backoff
        if found != counts[n]:
            raise InputError(
                f"{where}:{section}: the header counts {counts[n]} {n}-grams, the section "
                f"holds {found}"
            )
    while number < len(lines) and not lines[number].strip(" \t"):
        number += 1
    if number >= len(lines) or lines[number].strip(" \t") != "\\end\\":
        raise InputError(f"{where}:{number + 1}: expected \\end\\ after the {order}-grams")
    return NGramLM(order, probs, backoffs)


def _log10(text: str, where: str, number: int, what: str, bounded: bool = True) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value) or value == math.inf or (bounded and value > 1e-6):
        raise InputError(
            f"{where}:{number}: {what} {text!r} is not a log10 value" + (" <= 0" if bounded else "")
        )
    if value == -math.inf:
        return NEVER  # log 0, as ARPA writes it
    return min(value, 0.0) if bounded else value


def arpa_text(lm: NGramLM) -> str:
    """`lm` in the ARPA format (n-grams in each order's listed order)."""
    by_order: dict[int, list[tuple[str, ...]]] = {n: [] for n in range(1, lm.order + 1)}
    for ngram in lm.probs:
        by_order[len(ngram)].append(ngram)
    lines = ["\\data\\", *(f"ngram {n}={len(by_order[n])}" for n in by_order), ""]
    for n, ngrams in by_order.items():
        lines.append(f"\\{n}-grams:")
        for ngram in ngrams:
            line = f"{lm.probs[ngram]:.6f}\t{' '.join(ngram)}"
            if n < lm.order and ngram in lm.backoffs:
                line += f"\t{lm.backoffs[ngram]:.6f}"
            lines.append(line)
        lines.append("")
    lines.append("\\end\\")
    return "\n".join(lines) + "\n"


def write_arpa(lm: NGramLM, path: str | Path) -> Path:
    """Writes `lm` to `path` whole (a `.tmp` beside it, then renamed)."""
    from asrkit.outputs import write_files

    path = Path(path)
    write_files(path.parent, {path.name: arpa_text(lm)})
    return path
