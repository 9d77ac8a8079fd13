"""A NeMo model's SentencePiece tokenizer as an asrkit tokenizer: the same pieces, each one
id higher, with asrkit's `<blank>` inserted at id 0.

NeMo's transducers put the blank last (id V, after the V tokenizer ids); asrkit's blank is
id 0. Inserting a control piece in front of the model's pieces keeps segmentation exactly
as it was (a control piece is never produced from text) and makes every asrkit id the
NeMo id + 1, so one permutation of the joint's output rows maps the weights.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from asrkit.errors import InputError
from asrkit.tokenizer import BLANK_ID, BLANK_PIECE, Tokenizer, TokenizerSettings


class NemoTokenizerError(InputError):
    """A tokenizer model asrkit cannot take over (not SentencePiece, or unreadable)."""


def convert_nemo_tokenizer(model_bytes: bytes, out_dir: Path, source: str) -> Tokenizer:
    """Writes tokenizer.model + tokenizer.json into `out_dir` from a NeMo SentencePiece
    model's bytes. `lower_case` is set when no piece has an upper-case letter (the model
    was trained on lower-cased text: references are lower-cased to encode and hypotheses
    upper-cased, as asrkit's own tokenizers do); a cased model keeps text as it is."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(model_bytes)
    except Exception as err:
        raise NemoTokenizerError(f"{source}: not a SentencePiece model ({err})") from None
    if not proto.pieces:
        raise NemoTokenizerError(f"{source}: a SentencePiece model without pieces")
    pieces = list(proto.pieces)
    del proto.pieces[:]
    blank = proto.pieces.add()
    blank.piece, blank.score = BLANK_PIECE, 0.0
    blank.type = sentencepiece_model_pb2.ModelProto.SentencePiece.CONTROL
    proto.pieces.extend(pieces)
    spec = proto.trainer_spec
    for key in ("unk_id", "bos_id", "eos_id"):
        value = getattr(spec, key)
        setattr(spec, key, value + 1 if value >= 0 else value)
    spec.pad_id, spec.pad_piece = BLANK_ID, BLANK_PIECE
    cased = any(any(ch.isupper() for ch in p.piece) for p in pieces)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.model").write_bytes(proto.SerializeToString())
    kinds = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
    settings = TokenizerSettings(
        vocab_size=len(proto.pieces), model_type=kinds.get(spec.model_type, "unigram"),
        unk_id=spec.unk_id, lower_case=not cased,
    )  # fmt: skip
    (out_dir / "tokenizer.json").write_text(json.dumps(asdict(settings), indent=2) + "\n")
    return Tokenizer(out_dir / "tokenizer.model", settings)
