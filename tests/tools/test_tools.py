"""The benchmarks in tools/: every one starts and documents itself; the shared harness runs
a child in the one measuring environment; the memory tools measure on tiny shapes (slow)."""

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
SCRIPTS = sorted(p for p in TOOLS.glob("*.py") if p.name != "harness.py")


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_every_tool_answers_help(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(TOOLS))
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out and len(out.splitlines()) > 2


def test_the_harness_runs_a_child_in_the_measuring_environment(tmp_path):
    sys.path.insert(0, str(TOOLS))
    try:
        from harness import CHILD_ENV, run_child
    finally:
        sys.path.remove(str(TOOLS))
    child = tmp_path / "child.py"
    child.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(TOOLS)!r})\n"
        "from harness import child_request, reply\n"
        "request = child_request()\n"
        "reply({'twice': request['n'] * 2, 'bfc': os.environ['TF_CPU_ALLOCATOR_USE_BFC']})\n"
    )
    assert run_child(str(child), {"n": 21}) == {"twice": 42, "bfc": "true"}
    assert CHILD_ENV["TF_CPU_ALLOCATOR_USE_BFC"] == "true"
    child.write_text("import sys\nsys.stderr.write('broken on purpose\\n')\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match="broken on purpose"):
        run_child(str(child), {})


def _run(*args: str) -> str:
    run = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


@pytest.mark.slow
def test_the_memory_tools_measure_tiny_shapes():
    out = _run(str(TOOLS / "bench_rnnt_loss.py"), "--shapes", "2,12,4,16", "--reps", "1")
    assert "asrkit" in out and "failed" not in out
    out = _run(str(TOOLS / "bench_loss_memory.py"), "--batches", "1", "--seconds", "1",
               "--labels", "4", "--vocab", "32", "--repeats", "1")  # fmt: skip
    assert "MiB" in out
    out = _run(str(TOOLS / "bench_joint.py"), "--batch", "1", "--seconds", "1", "--labels", "4",
               "--vocab", "16", "--modes", "fused,pruned", "--steps", "1",
               "--set", "model.encoder.num_blocks=1")  # fmt: skip
    assert "MiB" in out
    assert "asrkit:" in _run(str(TOOLS / "bench_accumulation.py"), "--tables", "3")
