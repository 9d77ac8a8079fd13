"""What a decoding fuses into its search, from a spec the commands fill: word boosting's
phrase list, an n-gram LM and a LODR LM, each with a weight (or the experiment's
`decode.*_weight`). `read_fusion` checks the spec against the search and reads each file
once, before any model loads; `ReadFusion.tables` builds the fusion tables a search takes
once the model's pieces are known (`asrkit.decoding.fusion.tables.combine` of the boosting and LM
automata)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from asrkit.errors import InputError

FUSIONS = ("boost", "lm", "lodr")  # a LODR LM is subtracted beside an external LM


@dataclass(frozen=True)
class FusionSpec:
    """Files and weights (None: not given; a weight then comes from the experiment)."""

    boost: str | None = None  # a phrase list: one per line, or phrase<TAB>weight
    boost_weight: float | None = None  # per piece, where a line gives none
    lm: str | None = None  # ARPA over the model's pieces
    lm_weight: float | None = None
    lodr: str | None = None  # ARPA of the training transcripts, low order
    lodr_weight: float | None = None

    @property
    def options(self) -> tuple[str, ...]:
        """The options given, as a command names them (`--boost`, `--lm`, `--lodr`)."""
        return tuple(f"--{name}" for name in FUSIONS if getattr(self, name))

    def weights(self, decode) -> dict:
        """{"boost": path, "boost_weight": w, "lm": ...} of what is fused, each weight as
        given or `decode`'s (a DecodeConfig): what a result records beside its scores."""
        settings = {}
        for name in FUSIONS:
            if getattr(self, name):
                given = getattr(self, f"{name}_weight")
                settings[name] = str(getattr(self, name))
                settings[f"{name}_weight"] = (
                    getattr(decode, f"{name}_weight") if given is None else given
                )
        return settings


@dataclass(frozen=True)
class ReadFusion:
    """A spec with its files read: the phrases (unweighted lines' weight None) and LMs."""

    spec: FusionSpec
    phrases: list | None = None
    lms: dict = field(default_factory=dict)  # "lm" / "lodr" -> NGramLM

    def check_pieces(self, pieces: list[str], nemo_ids: bool = False) -> None:
        """Each LM is over these pieces (or NeMo's token names of them, `nemo_ids`)."""
        from asrkit.decoding.fusion.lm import lm_token_ids

        for name, lm in self.lms.items():
            lm_token_ids(lm, pieces, f"--{name}", nemo_ids)

    def tables(self, tokenizer, vocab_size: int, decode, nemo_ids: bool = False):
        """The fusion tables over `vocab_size` ids (None when nothing is fused); weights
        as given, else `decode`'s (a DecodeConfig)."""
        if not self.spec.options:
            return None
        from asrkit.decoding.fusion.boosting import Phrase, boost_automaton
        from asrkit.decoding.fusion.lm import lm_automaton
        from asrkit.decoding.fusion.tables import combine

        weights = self.spec.weights(decode)
        automata = []
        if self.spec.boost:
            default = weights["boost_weight"]
            phrases = [Phrase(p.text, default if p.weight is None else p.weight)
                       for p in self.phrases]  # fmt: skip
            automata.append(boost_automaton(phrases, self.spec.boost, tokenizer, vocab_size))
        pieces = [tokenizer.piece(i) for i in range(vocab_size)]
        for name, sign in (("lm", 1.0), ("lodr", -1.0)):
            if name in self.lms:
                weight = sign * weights[f"{name}_weight"]
                automata.append(lm_automaton(self.lms[name], pieces, weight, f"--{name}",
                                             nemo_ids))  # fmt: skip
        return combine(*automata)


def read_fusion(spec: FusionSpec, method: str) -> ReadFusion:
    """The spec checked (weights, LODR beside an LM, a search that takes fusion) and its
    files read once: mistakes named before any model loads."""
    from asrkit.decoding.search.strategies import check

    for name in FUSIONS:
        weight = getattr(spec, f"{name}_weight")
        if weight is not None and (not math.isfinite(weight) or weight < 0):
            raise InputError(f"--{name}-weight must be a number >= 0, got {weight}")
        if weight is not None and not getattr(spec, name):
            raise InputError(f"--{name}-weight without --{name}")
    if not spec.options:
        return ReadFusion(spec)
    check(method, fusion=spec.options)
    if spec.lodr and not spec.lm:
        raise InputError("--lodr subtracts a low-order LM beside an external one: add --lm")
    phrases = None
    if spec.boost:
        from asrkit.decoding.fusion.boosting import read_phrases

        phrases = read_phrases(spec.boost, weight=None)
    from asrkit.ngram import read_arpa

    lms = {name: read_arpa(getattr(spec, name), f"--{name}") for name in ("lm", "lodr")
           if getattr(spec, name)}  # fmt: skip
    return ReadFusion(spec, phrases, lms)
