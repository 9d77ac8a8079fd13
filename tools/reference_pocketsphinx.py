"""A reference recogniser for scale: PocketSphinx's English model on a manifest's audio.

PocketSphinx ships its US English acoustic model (trained on real speech), a 3-gram word LM
of general English and the CMU pronouncing dictionary inside its pip wheel, so it runs with
no download. It is not a like-for-like baseline (another training set, a closed 130 k-word
vocabulary, a word LM); it says how hard the audio is for a recogniser that never heard it.

Runs under any Python that has `pocketsphinx` and `soundfile` (not asrkit's environment:
neither is a dependency of asrkit) and writes `ref.txt` / `hyp.txt` as `asrkit decode` does,
so that asrkit's scoring tools read them:

    python3.11 -m venv /path/ps-venv && /path/ps-venv/bin/pip install pocketsphinx soundfile
    /path/ps-venv/bin/python tools/reference_pocketsphinx.py --manifest data/test-clean.jsonl \\
        --out exp/decode_test_pocketsphinx
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RATE = 16_000


def _utterances(manifest: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{manifest}:{number}: not JSON ({exc.msg})") from None
        audio = row.get("audio_path") or row.get("audio_filepath")
        if not audio or "text" not in row:
            raise SystemExit(f"{manifest}:{number}: needs audio_path (or audio_filepath) and text")
        path = Path(audio)
        rows.append({
            "id": row.get("id") or path.stem,
            "audio": path if path.is_absolute() else manifest.parent / path,
            "text": row["text"],
        })  # fmt: skip
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", required=True, type=Path, help="asrkit or NeMo JSONL")
    parser.add_argument("--out", required=True, type=Path, help="directory for ref.txt, hyp.txt")
    args = parser.parse_args(argv)
    try:
        import numpy as np
        import soundfile
        from pocketsphinx import Decoder
    except ImportError as exc:
        print(f"reference_pocketsphinx: {exc.name} is not installed in {sys.executable}; "
              "see the usage above", file=sys.stderr)  # fmt: skip
        return 2

    rows = _utterances(args.manifest)
    decoder = Decoder(samprate=RATE, logfn="/dev/null")
    hyps, audio_seconds, start = {}, 0.0, time.perf_counter()
    for row in rows:
        try:
            audio, rate = soundfile.read(row["audio"], dtype="int16")
        except (OSError, RuntimeError) as exc:
            print(f"reference_pocketsphinx: {row['audio']}: unreadable ({exc})", file=sys.stderr)
            return 2
        if rate != RATE:
            print(f"reference_pocketsphinx: {row['audio']}: {rate} Hz, wants {RATE}",
                  file=sys.stderr)  # fmt: skip
            return 2
        audio = audio if audio.ndim == 1 else audio.mean(axis=1).astype(np.int16)
        audio_seconds += len(audio) / RATE
        decoder.start_utt()
        decoder.process_raw(audio.tobytes(), full_utt=True)
        decoder.end_utt()
        hyp = decoder.hyp()
        hyps[row["id"]] = (hyp.hypstr if hyp else "").upper()
    seconds = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ref.txt").write_text("".join(f"{r['id']} {r['text']}\n" for r in rows))
    (args.out / "hyp.txt").write_text("".join(f"{r['id']} {hyps[r['id']]}\n" for r in rows))
    print(f"{len(rows)} utterances, {audio_seconds:.0f} s of audio, RTF "
          f"{seconds / max(audio_seconds, 1e-9):.3f} -> {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
