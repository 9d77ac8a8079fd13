"""ARPA files: back-off probabilities against a hand-computed table and the `kenlm`
package's scores (a committed fixture), a written LM read back, every malformed file
refused with its line."""

import gzip
import json
import math
from pathlib import Path

import pytest

from asrkit.errors import InputError
from asrkit.ngram import estimate, read_arpa, write_arpa
from asrkit.ngram.arpa import arpa_text

DATA = Path(__file__).resolve().parents[1] / "data" / "lm"

# A trigram LM small enough to score by hand.
HAND = """\\data\\
ngram 1=5
ngram 2=4
ngram 3=2

\\1-grams:
-99\t<s>\t-0.30
-0.50\ta\t-0.20
-0.70\tb\t-0.10
-1.00\t</s>
-2.00\t<unk>

\\2-grams:
-0.10\t<s> a\t-0.05
-0.40\ta b\t-0.15
-0.30\tb </s>
-0.60\tb a

\\3-grams:
-0.02\t<s> a b
-0.25\ta b a

\\end\\
"""

# log10 P(word | history), worked out by the back-off rule
HAND_TABLE = [
    ("a", ("<s>",), -0.10),  # listed bigram
    ("b", ("<s>", "a"), -0.02),  # listed trigram
    ("a", ("a", "b"), -0.25),  # listed trigram
    ("</s>", ("a", "b"), -0.15 + -0.30),  # bow(a b) + listed bigram b </s>
    ("b", ("b", "a"), 0.0 + -0.40),  # "b a" has no bow (0): bigram a b
    ("</s>", ("<s>", "a"), -0.05 + -0.20 + -1.00),  # bow(<s> a) + bow(a) + unigram
    ("b", ("b",), -0.10 + -0.70),  # bow(b) + unigram b
    ("zebra", ("a",), -0.20 + -2.00),  # an unlisted word scores as <unk>
    ("a", ("zebra",), -0.50),  # an unlisted context has no bow
    ("a", (), -0.50),
]


@pytest.fixture
def hand(tmp_path):
    path = tmp_path / "hand.arpa"
    path.write_text(HAND)
    return read_arpa(path)


@pytest.mark.parametrize("word, history, want", HAND_TABLE)
def test_back_off_probabilities_match_the_hand_computed_table(hand, word, history, want):
    assert hand.log10_prob(word, history) == pytest.approx(want, abs=1e-12)


def test_a_sentence_sums_its_words_and_its_end(hand):
    assert hand.sentence_log10(["a", "b"]) == pytest.approx(-0.10 - 0.02 - 0.15 - 0.30)


def test_scores_equal_the_kenlm_packages():
    """`tools/fixture_kenlm.py` scored sentences (unseen words among them) with kenlm over
    the committed ARPA file: each word's probability and each sentence's total."""
    lm = read_arpa(DATA / "kn4.arpa")
    rows = json.loads((DATA / "kenlm_scores.json").read_text())
    assert len(rows) >= 20 and any("zebra" in r["sentence"] for r in rows)
    for row in rows:
        words = row["sentence"].split()
        assert lm.sentence_log10(words) == pytest.approx(row["total"], abs=1e-4)
        history = ["<s>"]
        for word, (want, _) in zip([*words, "</s>"], row["words"], strict=True):
            assert lm.log10_prob(word, history) == pytest.approx(want, abs=1e-4)
            history.append(word)


def test_a_written_lm_reads_back_plain_and_gzipped(tmp_path):
    lm = estimate([["a", "b"], ["a"], ["b", "b", "c"]], 3, ["a", "b", "c", "d"])
    again = read_arpa(write_arpa(lm, tmp_path / "lm.arpa"))
    assert again.order == 3 and again.probs.keys() == lm.probs.keys()
    for ngram, value in lm.probs.items():
        assert again.probs[ngram] == pytest.approx(value, abs=1e-6)
    with gzip.open(tmp_path / "lm.arpa.gz", "wt") as f:
        f.write(arpa_text(lm))
    assert read_arpa(tmp_path / "lm.arpa.gz").probs.keys() == lm.probs.keys()
    assert not list(tmp_path.glob("*.tmp"))


def _broken(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    "old, new, message",
    [
        ("\\data\\\n", "", "no \\data\\ line"),
        ("ngram 2=4", "ngram 2 4", ":3: expected 'ngram N=count'"),
        ("ngram 2=4", "ngram 2=5", ":13: the header counts 5 2-grams, the section holds 4"),
        ("-0.40\ta b", "high\ta b", ":15: probability 'high' is not a log10 value <= 0"),
        ("-0.40\ta b", "0.40\ta b", ":15: probability '0.40' is not a log10 value <= 0"),
        ("-0.40\ta b\t-0.15", "-0.40\ta b\tnan", ":15: back-off weight 'nan' is not"),
        ("-0.30\tb </s>", "-0.30\tb </s> a x", ":16: a 2-gram line is a log10 probability, 2"),
        ("-0.60\tb a", "-0.60\ta b", ":17: 'a b' listed twice"),
        ("\\3-grams:", "\\4-grams:", ":19: expected \\3-grams:, found '\\4-grams:'"),
        ("\\end\\\n", "", "expected \\end\\ after the 3-grams"),
        ("ngram 3=2\n", "ngram 4=2\n", "the \\data\\ header must count orders 1 to N"),
    ],
)
def test_a_malformed_file_is_refused_naming_its_line(tmp_path, old, new, message):
    path = tmp_path / "lm.arpa"
    path.write_text(_broken(HAND, old, new))
    with pytest.raises(InputError) as err:
        read_arpa(path)
    assert f"--lm {path}" in str(err.value) and message in str(err.value), str(err.value)


def test_missing_and_binary_files_are_refused(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_arpa(tmp_path / "none.arpa")
    (tmp_path / "lm.arpa.gz").write_bytes(b"not gzip at all")
    with pytest.raises(InputError, match="not an ARPA text file"):
        read_arpa(tmp_path / "lm.arpa.gz", "--lodr")
    (tmp_path / "bin.arpa").write_bytes(bytes(range(256)))
    with pytest.raises(InputError, match="not an ARPA text file"):
        read_arpa(tmp_path / "bin.arpa")


def test_log_zero_is_read_as_arpas_never(tmp_path):
    path = tmp_path / "lm.arpa"
    path.write_text(_broken(HAND, "-2.00\t<unk>", "-inf\t<unk>"))
    assert read_arpa(path).probs[("<unk>",)] == -99.0
    assert not math.isinf(read_arpa(path).log10_prob("zebra"))


def test_words_may_be_characters_python_counts_as_whitespace(tmp_path):
    """NeMo's token LMs write token k as chr(k + 100): token 33 is U+0085 (a line break to
    Python) and token 60 U+00A0 (a no-break space). Only spaces, tabs and newlines
    separate."""
    odd = ["\x85", "\xa0", "a"]
    lm = estimate([odd, odd[:2]], 2, odd)
    path = write_arpa(lm, tmp_path / "nemo.arpa")
    again = read_arpa(path)
    assert again.probs.keys() == lm.probs.keys()
    assert again.sentence_log10(odd) == pytest.approx(lm.sentence_log10(odd), abs=1e-5)
