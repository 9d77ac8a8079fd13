"""Which searches a model can run, answered from its config alone (no TensorFlow), so a
command refuses an impossible request before any model loads."""

from __future__ import annotations

from asrkit.config import ModelConfig
from asrkit.errors import InputError

BOOST_UNSUPPORTED = "--boost works in greedy and beam search, not --method ctc"

NO_CTC_HEAD = (
    "--method ctc: this model has no CTC head (model.ctc_head; a NeMo hybrid imports one); "
    "use --method greedy or beam"
)


def check_method(method: str, model: ModelConfig) -> None:
    """`method` (greedy, beam, ctc) is one this model's network can run."""
    if method == "ctc" and not model.ctc_head:
        raise InputError(NO_CTC_HEAD)
