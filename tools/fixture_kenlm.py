"""Reference scores of an ARPA LM from the `kenlm` package, for asrkit's ARPA tests.

Writes an order-4 Kneser-Ney LM of a small random text (asrkit's estimator; the file is
what is checked) and kenlm's log10 scores of sentences over it: each word's probability
with the n-gram length kenlm used, and each sentence's total, with and without <s>/</s>.
Run with a Python that has `kenlm` (pip install kenlm; it builds from source):

    /path/kenlm-venv/bin/python tools/fixture_kenlm.py --out tests/data/lm

asrkit itself never imports kenlm.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = ["the", "cab", "bad", "and", "a", "nab", "band", "dab"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import kenlm

    from asrkit.ngram import estimate, write_arpa

    rng = random.Random(3)
    text = [[rng.choice(WORDS[:6]) for _ in range(rng.randint(1, 7))] for _ in range(60)]
    out = Path(args.out)
    arpa = write_arpa(estimate(text, 4, WORDS), out / "kn4.arpa")
    model = kenlm.Model(str(arpa))
    queries = [" ".join(rng.choice([*WORDS, "zebra"]) for _ in range(rng.randint(0, 9)))
               for _ in range(40)]  # fmt: skip
    rows = []
    for sentence in queries:
        rows.append({
            "sentence": sentence,
            "total": model.score(sentence, bos=True, eos=True),
            "total_no_bos_eos": model.score(sentence, bos=False, eos=False),
            "words": [[p, n] for p, n, _ in model.full_scores(sentence, bos=True, eos=True)],
        })  # fmt: skip
    (out / "kenlm_scores.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{arpa}, {len(rows)} sentences scored by kenlm -> {out / 'kenlm_scores.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
