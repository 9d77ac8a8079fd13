"""Back-off n-gram language models: ARPA files read and written, Kneser-Ney estimation."""

from asrkit.ngram.arpa import read_arpa, write_arpa
from asrkit.ngram.kneser_ney import estimate
from asrkit.ngram.model import NGramLM

__all__ = ["NGramLM", "estimate", "read_arpa", "write_arpa"]
