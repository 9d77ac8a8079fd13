"""The decoding strategies: one table keyed by (what the network decodes as, method) that
says what each search can do, and one `check` that makes every refusal from it, answered
from the config alone (no TensorFlow), so a command refuses an impossible request before
any model loads. The search front (`asrkit.decoding.search.front`), the streaming decoder, the
export and the commands all ask here.

What a network decodes as: `rnnt` (a transducer), `tdt` (a transducer whose joint also
predicts durations, `model.durations`) or `ctc` (a hybrid network's CTC head, `--method
ctc`)."""

from __future__ import annotations

from dataclasses import dataclass

from asrkit.config import DECODE_METHODS
from asrkit.errors import InputError

METHODS = DECODE_METHODS  # ctc: greedy on a hybrid network's CTC head


@dataclass(frozen=True)
class Strategy:
    """One search and what it can do."""

    decoder: str  # rnnt | tdt | ctc
    method: str  # greedy | beam | ctc
    streams: bool  # the streaming decoder runs it (`transcribe --streaming`)
    streaming_export: bool  # `asrkit export --streaming` builds it into the graph
    fusion: bool  # takes word boosting and LM tables
    beam_hypotheses: bool  # finds a beam of hypotheses (the n-best list); else one

    def hypotheses(self, beam: int) -> int:
        """How many hypotheses it gives per utterance at this beam."""
        return beam if self.beam_hypotheses else 1


STRATEGIES = {
    (s.decoder, s.method): s
    for s in (
        Strategy("rnnt", "greedy", streams=True, streaming_export=True, fusion=True,
                 beam_hypotheses=False),
        Strategy("rnnt", "beam", streams=True, streaming_export=False, fusion=True,
                 beam_hypotheses=True),
        # TDT's beam search moves hypotheses through frames at their own pace: no stream
        Strategy("tdt", "greedy", streams=True, streaming_export=True, fusion=True,
                 beam_hypotheses=False),
        Strategy("tdt", "beam", streams=False, streaming_export=False, fusion=True,
                 beam_hypotheses=True),
        Strategy("ctc", "ctc", streams=False, streaming_export=False, fusion=False,
                 beam_hypotheses=False),
    )
}  # fmt: skip

NO_CTC_HEAD = (
    "--method ctc: this model has no CTC head (model.ctc_head; a NeMo hybrid imports one); "
    "use --method greedy or beam"
)


def decoder_of(method: str, durations=(), ctc_head: bool = True) -> str:
    """What a network with these `durations` decodes as under `method` (the CTC head for
    `--method ctc`, refused without one)."""
    if method not in METHODS:
        raise InputError(f"decoding method must be one of {METHODS}, got {method!r}")
    if method == "ctc":
        if not ctc_head:
            raise InputError(NO_CTC_HEAD)
        return "ctc"
    return "tdt" if durations else "rnnt"


def strategy(method: str, model=None) -> Strategy:
    """The strategy of `method` on a model (a ModelConfig; None: a transducer whose kind is
    not known yet, which RNN-T's row answers for what the two kinds share)."""
    if model is None:
        return STRATEGIES[decoder_of(method), method]
    return STRATEGIES[decoder_of(method, model.durations, model.ctc_head), method]


def check(
    method: str,
    model=None,
    *,
    fusion: tuple[str, ...] = (),
    streaming: bool = False,
    streaming_export: bool = False,
    nbest: int = 0,
    beam: int = 4,
) -> Strategy:
    """Every refusal of a decoding request, in one place: `method` on `model` (a
    ModelConfig, or None before it is known), with the fusion options given (`("--boost",
    "--lm")`), streamed, built into a streaming export, asked for an `nbest` list. Returns
    the strategy; raises InputError saying what to do instead."""
    found = strategy(method, model)
    if fusion and not found.fusion:
        verb = "works" if len(fusion) == 1 else "work"
        raise InputError(f"{' and '.join(fusion)} {verb} in greedy and beam search, not --method "
                         f"{method}")  # fmt: skip
    if streaming_export and not found.streaming_export:
        raise InputError(f"--streaming exports greedy search: drop --method {method}")
    if streaming and not found.streams:
        if found.decoder == "ctc":
            raise InputError("--streaming decodes the transducer: use --method greedy or beam")
        raise InputError(
            "a TDT model (model.durations) streams with greedy search only (its beam search "
            "moves hypotheses through frames at their own pace): stream with --method greedy, "
            "or decode the whole waveform with beam search"
        )
    if nbest > 1 and not found.beam_hypotheses:
        raise InputError(
            f"--nbest {nbest}: {method} search finds one hypothesis; add --method beam "
            f"--beam {max(nbest, beam)} for an n-best list"
        )
    return found
