"""The demo's spread: N fresh `make demo` runs, each from its own clone, one after another.

Each run clones the repository (its committed HEAD) into a new directory and runs
`make demo SEED=<seed>` there, exactly as a new user would (the install included, from
whatever package cache the machine has), and collects from it: test-clean WER with beam
search and greedy, the training stage's time and the whole command's time. Prints one row
per run, then the median and the worst; writes the rows as JSON.

    python tools/demo_runs.py [--runs 3] [--seeds 0 1 2] [--work /tmp/asrkit-demo-runs]
                              [--set loss.kind=pruned ...]

Runs are sequential on purpose: two at once on the same cores would measure each other.
`--seeds` varies the corpus (texts, voices, which voices are held out) and the training
seed; the default repeats seed 0, which is what `make demo` runs.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGE_TIME = re.compile(r"stage (\d+) \((\w+)\) took (\d+) s")


def one_run(work: Path, seed: int, log, sets: list[str]) -> dict:
    if work.exists():
        shutil.rmtree(work)
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(work)], check=True)
    start = time.perf_counter()
    with open(work / "demo.log", "w") as out:
        make = ["make", "demo", f"SEED={seed}"] + ([f"SET={' '.join(sets)}"] if sets else [])
        done = subprocess.run(make, cwd=work, stdout=out,
                              stderr=subprocess.STDOUT)  # fmt: skip
    total = time.perf_counter() - start
    text = (work / "demo.log").read_text()
    if done.returncode != 0:
        log(f"make demo failed (exit {done.returncode}); its log: {work / 'demo.log'}")
        return {"seed": seed, "failed": done.returncode, "log": str(work / "demo.log")}
    stages = {name: int(seconds) for _, name, seconds in STAGE_TIME.findall(text)}
    exp = work / "exp" / "mini" / "exp"
    beam = json.loads((exp / "decode_test" / "wer.json").read_text())
    greedy = json.loads((exp / "decode_test_greedy" / "wer.json").read_text())
    return {
        "seed": seed,
        "wer_beam": beam["wer"],
        "wer_greedy": greedy["wer"],
        "words": beam["words"],
        "train_seconds": stages.get("train"),
        "total_seconds": round(total),
        "stage_seconds": stages,
        "work": str(work),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seeds", type=int, nargs="+", help="one per run (default: all 0)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/asrkit-demo-runs"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a training config override for every run (repeatable)")  # fmt: skip
    parser.add_argument("--out", type=Path, help="JSON rows (default: <work>/runs.json)")
    args = parser.parse_args()
    seeds = args.seeds or [0] * args.runs
    args.work.mkdir(parents=True, exist_ok=True)
    out = args.out or args.work / "runs.json"

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    rows = []
    for index, seed in enumerate(seeds):
        log(f"run {index + 1}/{len(seeds)}: seed {seed}")
        rows.append(one_run(args.work / f"run{index + 1}-seed{seed}", seed, log, args.set))
        out.write_text(json.dumps(rows, indent=1) + "\n")
    good = [r for r in rows if "failed" not in r]
    print("\n| run | seed | WER beam 4 | WER greedy | training | make demo |")
    print("|---|---|---|---|---|---|")
    for index, row in enumerate(rows, 1):
        if "failed" in row:
            print(f"| {index} | {row['seed']} | failed | | | |")
            continue
        print(
            f"| {index} | {row['seed']} | {100 * row['wer_beam']:.2f} % | "
            f"{100 * row['wer_greedy']:.2f} % | {row['train_seconds']} s | "
            f"{row['total_seconds']} s |"
        )
    if good:
        beams = [100 * r["wer_beam"] for r in good]
        print(
            f"\nbeam WER median {statistics.median(beams):.2f} %, worst {max(beams):.2f} %, "
            f"best {min(beams):.2f} %; training median "
            f"{statistics.median(r['train_seconds'] for r in good):.0f} s, worst "
            f"{max(r['train_seconds'] for r in good)} s; make demo worst "
            f"{max(r['total_seconds'] for r in good)} s  ({len(good)} of {len(rows)} runs)"
        )
    print(f"rows: {out}")
    sys.exit(0 if len(good) == len(rows) else 1)


if __name__ == "__main__":
    main()
