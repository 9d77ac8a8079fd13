"""Reference LM scores from NeMo's own n-gram LM code, for a token LM in NeMo's encoding.

Writes an order-3 Kneser-Ney LM (asrkit's estimator) over 30 NeMo token ids in NeMo's
encoding (token k as the character chr(k + 100), as NeMo's `train_kenlm.py` writes its LMs
for BPE models), then scores token sequences with NeMo's `NGramGPULanguageModel` on the CPU
(`from_arpa`, `advance`, `get_final`): at every step the score of every token, and the
final score. asrkit's test reads the same ARPA for a model imported from NeMo (asrkit id
k + 1 for NeMo's k) and must give the same scores. NeMo runs in its own venv:

    python tools/fixture_nemo_lm.py --nemo-python /path/nemo-venv/bin/python --out tests/data/lm
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VOCAB = 30  # NeMo token ids 0..29 (the blank, 30, is not in the LM)
OFFSET = 100


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nemo-python", help="the Python of a venv with NeMo")
    parser.add_argument("--out", required=True)
    parser.add_argument("--score", help=argparse.SUPPRESS)  # the NeMo child's ARPA
    args = parser.parse_args()
    if args.score:
        print(json.dumps(_nemo_scores(args.score)))
        return 0
    from asrkit.ngram import estimate, write_arpa

    rng = random.Random(5)
    words = [chr(OFFSET + k) for k in range(VOCAB)]
    text = [[rng.choice(words[:20]) for _ in range(rng.randint(1, 9))] for _ in range(300)]
    arpa = write_arpa(estimate(text, 3, words), Path(args.out) / "nemo_tokens3.arpa")
    child = subprocess.run([args.nemo_python, __file__, "--out", args.out, "--score", str(arpa)],
                           capture_output=True, text=True, check=True)  # fmt: skip
    scores = json.loads(child.stdout.strip().splitlines()[-1])
    (Path(args.out) / "nemo_lm_scores.json").write_text(json.dumps(scores) + "\n")
    print(f"{arpa}, {len(scores)} sequences scored by NeMo -> nemo_lm_scores.json")
    return 0


def _nemo_scores(arpa: str) -> list[dict]:
    import logging

    logging.disable(logging.WARNING)
    import torch
    from nemo.collections.asr.parts.submodules.ngram_lm import NGramGPULanguageModel

    lm = NGramGPULanguageModel.from_arpa(arpa, vocab_size=VOCAB, normalize_unk=False,
                                         use_triton=False, token_offset=OFFSET)  # fmt: skip
    rng = random.Random(7)
    rows = []
    for _ in range(12):
        tokens = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 8))]
        state = lm.get_init_states(1, bos=True)
        steps = []
        with torch.no_grad():
            for token in tokens:
                scores, next_states = lm.advance(state)
                steps.append([float(x) for x in scores[0]])
                state = next_states[:, token]
            final = float(lm.get_final(state)[0])
        rows.append({"tokens": tokens, "steps": steps, "final": final})
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
