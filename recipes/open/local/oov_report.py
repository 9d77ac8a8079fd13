"""The open recipe's report on a decoded test set: WER and CER, the WER of the sentences
holding a word the training transcripts never say (out of vocabulary) and of the others,
the WER of the sentences saying a held-out name and of the others, and the share of OOV
words and of the held-out names recognised exactly.

    python recipes/open/local/oov_report.py --corpus corpus --decode exp/decode_test_beam
"""

import argparse
import json
import sys
from pathlib import Path


def _texts(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        uid, _, text = line.partition(" ")
        out[uid] = text
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="the corpus (train-clean-100, names.txt)")
    parser.add_argument("--decode", required=True, help="a decode directory (ref.txt, hyp.txt)")
    args = parser.parse_args(argv)
    from asrkit.metrics import error_rates, normalize, words_recognised

    corpus, decoded = Path(args.corpus), Path(args.decode)
    training = {
        w for f in (corpus / "train-clean-100").rglob("*.trans.txt")
        for line in f.read_text(encoding="utf-8").splitlines()
        for w in normalize(line.partition(" ")[2]).split()
    }  # fmt: skip
    refs, hyps = _texts(decoded / "ref.txt"), _texts(decoded / "hyp.txt")
    ids = sorted(refs)
    ref, hyp = [refs[i] for i in ids], [hyps.get(i, "") for i in ids]
    oov = {w for r in ref for w in normalize(r).split() if w not in training}
    names = {normalize(w) for w in (corpus / "names.txt").read_text(encoding="utf-8").split()}
    with_oov = [k for k, r in enumerate(ref) if set(normalize(r).split()) & oov]
    without = [k for k in range(len(ref)) if k not in set(with_oov)]
    named = {k for k, r in enumerate(ref) if set(normalize(r).split()) & names}
    rows = {"all": error_rates(ref, hyp)}
    for name, keep in (
        ("with OOV words", with_oov),
        ("without", without),
        ("with names", sorted(named)),
        ("without names", [k for k in range(len(ref)) if k not in named]),
    ):
        if keep:
            rows[name] = error_rates([ref[k] for k in keep], [hyp[k] for k in keep])
    found_oov, total_oov = words_recognised(ref, hyp, oov)
    found_names, total_names = words_recognised(ref, hyp, names)
    words = sum(len(normalize(r).split()) for r in ref)
    report = {
        "decode": str(decoded),
        "utterances": len(ref),
        **{f"wer {k}": round(100 * v.wer, 2) for k, v in rows.items()},
        "cer all": round(100 * rows["all"].cer, 2),
        "sentences with OOV words": len(with_oov),
        "oov share of words": round(100 * total_oov / max(words, 1), 2),
        "oov words recognised": f"{found_oov}/{total_oov}",
        "names recognised": f"{found_names}/{total_names}",
    }
    for key, value in report.items():
        print(f"{key}: {value}")
    (decoded / "oov.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
