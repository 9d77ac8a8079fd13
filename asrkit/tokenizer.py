"""SentencePiece tokenizer; the blank id is defined here, once.

Id 0 is the transducer blank, stored in the SentencePiece model as its (never emitted)
padding piece `<blank>`; id 1 is `<unk>`. So model ids and SentencePiece ids are the same,
and `vocab_size` is the joint network's V.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from asrkit.errors import InputError

BLANK_ID = 0
BLANK_PIECE = "<blank>"
UNK_ID = 1
MODEL_TYPES = ("unigram", "bpe", "char")


@dataclass(frozen=True)
class TokenizerSettings:
    vocab_size: int
    model_type: str
    blank_id: int = BLANK_ID
    unk_id: int = UNK_ID
    # Text is lower-cased to encode and hypotheses are upper-cased (the LibriSpeech
    # convention); false: a cased model's text as it is (e.g. an imported NeMo model).
    lower_case: bool = True


class Tokenizer:
    def __init__(self, model_path: str | os.PathLike, settings: TokenizerSettings):
        self.model_path = Path(model_path)
        import sentencepiece

        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(model_path))
        self.settings = settings
        if self._sp.id_to_piece(BLANK_ID) != BLANK_PIECE:
            raise ValueError(
                f"{model_path}: id {BLANK_ID} is not {BLANK_PIECE}; not an asrkit model"
            )

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Tokenizer:
        directory = Path(directory)
        settings_path = directory / "tokenizer.json"
        if not settings_path.exists():
            raise FileNotFoundError(
                f"{settings_path}: missing (train with `asrkit tokenizer train`)"
            )
        settings = TokenizerSettings(**json.loads(settings_path.read_text()))
        return cls(directory / "tokenizer.model", settings)

    @property
    def fingerprint(self) -> str:
        """Identity of the SentencePiece model (its bytes), recorded with shards."""
        return hashlib.sha256(self.model_path.read_bytes()).hexdigest()[:16]

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def blank_id(self) -> int:
        return BLANK_ID

    def _prepared(self, text: str) -> str:
        text = unicodedata.normalize("NFC", text)
        return text.lower() if self.settings.lower_case else text

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (Unicode NFC; lower-cased for a lower-case model)."""
        return self._sp.encode(self._prepared(text))

    def segmentations(self, text: str, n: int) -> list[list[int]]:
        """Up to `n` ways to write `text` in pieces, the most likely first (a unigram model's
        n-best; other models: their one encoding)."""
        prepared = self._prepared(text)
        if self.settings.model_type == "unigram" and n > 1:
            found = self._sp.nbest_encode(prepared, nbest_size=n)
            if found:
                return [list(ids) for ids in found]
        return [self._sp.encode(prepared)]

    def unknown(self, text: str) -> list[str]:
        """Each character of `text` this tokenizer can only encode as `<unk>` (its pieces do
        not hold it), once per occurrence: what a model trained on it could never emit."""
        prepared = self._prepared(text)
        if UNK_ID not in self._sp.encode(prepared):
            return []
        missing = {c for c in set(prepared) if not c.isspace() and UNK_ID in self._sp.encode(c)}
        return [c for c in prepared if c in missing]

    def decode(self, ids: Iterable[int]) -> str:
        """Text (upper-case unless the model is cased), words separated by single spaces."""
        text = self._sp.decode([int(i) for i in ids if int(i) != BLANK_ID])
        return " ".join((text.upper() if self.settings.lower_case else text).split())

    def piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id))

    def surface_pieces(self) -> list[str]:
        """Each id's text with word boundaries as spaces ("" for blank and control ids):
        joining them, collapsing spaces and upper-casing reproduces `decode` — the table
        an exported graph detokenises with."""
        out = []
        for i in range(self.vocab_size):
            if i == BLANK_ID or self._sp.is_control(i):
                out.append("")
            elif self._sp.is_unknown(i):
                out.append(" \u2047 ")
            else:
                out.append(self._sp.id_to_piece(i).replace("\u2581", " "))
        return out


def train_tokenizer(
    texts: Iterable[str],
    out_dir: str | os.PathLike,
    vocab_size: int,
    model_type: str = "unigram",
    keep_case: bool = False,
) -> Tokenizer:
    """Trains on `texts` (Unicode NFC; lower-cased unless `keep_case`, punctuation kept as
    written) and writes tokenizer.model + tokenizer.json."""
    import sentencepiece

    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = [unicodedata.normalize("NFC", t) for t in texts if t.strip()]
    texts = texts if keep_case else [t.lower() for t in texts]
    if not texts:
        raise InputError("no text to train the tokenizer on (are the manifests empty?)")
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_prefix=str(out_dir / "tokenizer"),
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=1.0,
            pad_id=BLANK_ID,
            pad_piece=BLANK_PIECE,
            unk_id=UNK_ID,
            bos_id=-1,
            eos_id=-1,
            hard_vocab_limit=model_type != "char",
            minloglevel=2,
        )
    except RuntimeError as err:
        fits = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)",
                         str(err))  # fmt: skip
        if fits:
            raise InputError(
                f"--vocab-size {fits[1]}: this text holds too few distinct pieces for that "
                f"many; at most {fits[2]} fit (the fine-tuning recipe: --vocab {fits[2]} or "
                "less), or train on more text"
            ) from None
        raise InputError(f"sentencepiece refused the tokenizer settings: {err}") from None
    settings = TokenizerSettings(
        vocab_size=vocab_size, model_type=model_type, lower_case=not keep_case
    )
    (out_dir / "tokenizer.json").write_text(json.dumps(asdict(settings), indent=2) + "\n")
    (out_dir / "tokenizer.vocab").unlink(missing_ok=True)
    return Tokenizer(out_dir / "tokenizer.model", settings)
