"""The docs say what is true today: no development history, every module in the layout, a
README of manual length with the two set-up commands."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Words of a development diary: sessions, rounds, issue numbers, scratch paths, "until now".
HISTORY = re.compile(
    r"\bsessions?\b|\bthis round\b|\bround \d|(?<![\w/&])#\d+\b|/tmp/[A-Za-z]|\buntil this\b"
    r"|\bas before\b|\bbefore this key\b|\basrkit 0\.\d",
    re.IGNORECASE,
)


def _docs_and_sources():
    docs = [p for p in ROOT.rglob("*.md") if not {".venv", "data", ".git"} & set(p.parts)]
    return [*docs, *sorted((ROOT / "asrkit").rglob("*.py"))]


def test_no_development_history_in_docs_comments_or_docstrings():
    found = []
    for path in _docs_and_sources():
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if HISTORY.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_history_pattern_catches_what_it_is_for():
    for line in ("in session 10 we", "this round's change", "see #14", "--work /tmp/s10",
                 "as before serve_batch existed", "written by asrkit 0.1"):  # fmt: skip
        assert HISTORY.search(line), line
    for line in ("round(x, 3)", "the channel #", "[B, T]", "cd /tmp && ls"):
        assert not HISTORY.search(line), line


def test_every_module_is_in_the_layout():
    layout = (ROOT / "docs" / "layout.md").read_text()
    listed = set(re.findall(r"`(asrkit/[\w/]+\.py)`", layout))
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "asrkit").rglob("*.py")}
    assert modules - listed == set(), "add to docs/layout.md"
    assert listed - modules == set(), "no longer exists: remove from docs/layout.md"


def test_the_readme_is_a_manual_with_the_two_set_up_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 260
    commands = re.findall(r"^make (\w+)", readme, re.MULTILINE)
    assert commands == ["make demo", "make test"] or commands == ["demo", "test"]
    for linked in re.findall(r"`((?:docs/|RESULTS)[\w/.-]+\.md)`", readme):
        assert (ROOT / linked).is_file(), linked
