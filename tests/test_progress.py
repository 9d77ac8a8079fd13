"""The loop progress bar: redrawn in place on a terminal, plain lines in a log."""

import io

from asrkit import progress as progress_module
from asrkit.progress import progress


class _Stream(io.StringIO):
    def __init__(self, terminal: bool):
        super().__init__()
        self.terminal = terminal

    def isatty(self):
        return self.terminal


def _run(monkeypatch, terminal: bool, seconds_per_item: float) -> str:
    stream = _Stream(terminal)
    clock = iter(i * seconds_per_item for i in range(1000))
    monkeypatch.setattr(progress_module.sys, "stderr", stream)
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: float(next(clock)))
    assert list(progress(range(100), total=100, label="extract")) == list(range(100))
    return stream.getvalue()


def test_a_log_gets_plain_lines_every_30_seconds_and_one_at_the_end(monkeypatch):
    written = _run(monkeypatch, terminal=False, seconds_per_item=1.0)  # 100 s in all
    lines = written.splitlines()
    assert "\r" not in written and len(lines) == 4, lines  # at 30, 60, 90 s and the end
    assert lines[-1].startswith("extract 100/100 in ")


def test_a_terminal_gets_one_bar_redrawn_in_place(monkeypatch):
    written = _run(monkeypatch, terminal=True, seconds_per_item=0.5)
    assert written.count("\r") >= 99 and written.endswith("\n") and written.count("\n") == 1
    assert "100/100" in written.split("\r")[-1]
