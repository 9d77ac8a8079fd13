"""From a search's tokens to text and timed words, in TensorFlow ops (one definition for
`asrkit decode`/`transcribe` and the exported graph, so the two cannot disagree).

Times. Encoder frame t is made from feature frames 4t .. 4t+6 (two 3-wide, stride-2
convolutions); a token emitted at frame t gets the centre of that span as its time:
`offset + t * period` with `period = 4 * frame_step / rate` (40 ms) and
`offset = (3 * frame_step + frame_length / 2) / rate` (42.5 ms). A transducer emits a token
once it has heard it, so this is when the model *recognised* the token, typically a little
after it began. An experiment calibrated by `asrkit calibrate` also holds its emission delay
(`asrkit.decoding.onset`), which the clock subtracts: `max(0, offset - delay + t * period)`
(measured against eSpeak's own word boundaries (RESULTS.md, word timing)).

Words. A word starts at a piece that begins with a word boundary ("▁", a space in
`Tokenizer.surface_pieces`), unless the piece before it was a bare boundary (which then
began the word), and at the first token. A word's start is the time of its first token —
except for a bare boundary that opens the hypothesis: every transcript starts with one,
so a model emits it on the first frames whatever the audio (measured: on a window that
opens with a pause it came ~0.6 s before the word), and the first word starts at its
next token instead. Its end is the last token's time plus one frame period — but
no later than the next word's start, so words never overlap (tokens of two words emitted
at one frame end the first word at its last token's time) — and its confidence the
lowest posterior probability among its tokens (the joint's probability of the token
where it was emitted): one unsure piece makes an unsure word. Words whose text is empty
are dropped, so joining the words with spaces gives exactly the hypothesis' text.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from asrkit.config import FeatureConfig
from asrkit.features import front_end

SUBSAMPLING = 4  # feature frames per encoder frame (asrkit.features.encoder_frames)
RECEPTIVE_CENTRE = 3  # the centre of encoder frame 0's feature frames 0 .. 6


@dataclass(frozen=True)
class Word:
    text: str
    start: float  # seconds
    end: float  # seconds
    confidence: float  # in (0, 1]


@dataclass(frozen=True)
class FrameClock:
    """Encoder frame index -> seconds: the centre of the frame's audio, less the model's
    emission delay (never before 0)."""

    period: float
    offset: float  # the centre of encoder frame 0's audio
    delay: float = 0.0  # seconds the model emits a word after it starts (asrkit calibrate)

    @classmethod
    def of(cls, features: FeatureConfig, delay: float = 0.0, encoder=None) -> FrameClock:
        """The clock of a model's features and encoder (an EncoderConfig; default asrkit's
        x4 subsampling). NeMo's features are centred on their hop (a centred STFT) and its
        subsampling pads, so its encoder frame t is centred at t x factor x hop."""
        rate = float(features.sample_rate)
        factor = encoder.frames_per_output if encoder is not None else SUBSAMPLING
        if front_end(features).centred:
            offset = 0.0
        else:
            offset = (RECEPTIVE_CENTRE * features.frame_step + features.frame_length / 2) / rate
        return cls(period=factor * features.frame_step / rate, offset=offset, delay=float(delay))

    def seconds(self, frames):
        raw = self.offset - self.delay + tf.cast(frames, tf.float32) * self.period
        return tf.maximum(raw, 0.0)


def detokenize(tokens, counts, pieces):
    """tokens [..., N] (slots past counts hold -1), counts [...], pieces: string [V] from
    `Tokenizer.surface_pieces` -> upper-case text [...], words separated by single spaces
    (what `Tokenizer.decode` returns)."""
    valid = tf.range(tf.shape(tokens)[-1]) < counts[..., None]
    text = tf.strings.reduce_join(
        tf.where(valid, tf.gather(pieces, tf.maximum(tokens, 0)), ""), axis=-1
    )
    return tf.strings.upper(tf.strings.strip(tf.strings.regex_replace(text, " +", " ")))


# Seconds a character takes when an utterance has too few words to measure its own pace
# (read English: eSpeak's voices at the synthetic corpus' rates took 61 ms, LibriSpeech's
# readers speak ~14 characters a second).
SECONDS_PER_CHARACTER = 0.065


def _spoken_seconds(words, starts, word_counts):
    """How long each word [B, W] takes to say: its characters at its utterance's own pace,
    the characters (a space each between words) from its first word's start to its last's
    over that time; `SECONDS_PER_CHARACTER` where fewer than three words give no pace."""
    chars = tf.cast(tf.strings.length(words, unit="UTF8_CHAR"), tf.float32)
    width = tf.shape(words)[1]
    last = tf.maximum(word_counts - 1, 0)
    before_last = tf.range(width)[None, :] < last[:, None]
    padded = tf.pad(starts, [[0, 0], [0, 1]])  # a row may hold no word
    span = tf.gather(padded, last[:, None], batch_dims=1)[:, 0] - padded[:, 0]
    said = tf.reduce_sum(tf.where(before_last, chars + 1.0, 0.0), axis=1)
    pace = tf.where((word_counts >= 3) & (span > 0), span / tf.maximum(said, 1.0),
                    SECONDS_PER_CHARACTER)  # fmt: skip
    return chars * pace[:, None]


def timed_words(tokens, frames, token_log_probs, counts, pieces, clock: FrameClock):
    """One row per utterance: tokens/frames/token_log_probs [B, N], counts [B] ->
    {"words": string [B, W], "word_starts", "word_ends", "word_confidence": float32 [B, W],
    "word_counts": int32 [B], "token_words": int32 [B, N]}; W is the most words in a row,
    slots past word_counts[b] hold "" and 0; token_words is each token's word (-1: none)."""
    batch, slots = tf.shape(tokens)[0], tf.shape(tokens)[1]
    position = tf.range(slots)[None, :]
    valid = position < counts[:, None]
    piece = tf.where(valid, tf.gather(pieces, tf.maximum(tokens, 0)), "")
    bare = tf.logical_and(valid, tf.strings.strip(piece) == "")
    after_bare = tf.pad(bare[:, :-1], [[0, 0], [1, 0]])
    boundary = tf.strings.regex_full_match(piece, r"\s.*")
    starts = valid & ((boundary & ~after_bare) | (position == 0))
    index = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1  # word of each token
    segments = batch * slots  # word w of row b is segment b·N + w; one more for the slots
    flat = tf.reshape(tf.where(valid, index + tf.range(batch)[:, None] * slots, segments), [-1])

    def per_word(reduce, values):
        return reduce(tf.reshape(values, [-1]), flat, segments + 1)[:segments]

    text = per_word(tf.strings.unsorted_segment_join, piece)
    text = tf.strings.upper(tf.strings.strip(tf.strings.regex_replace(text, r"\s+", " ")))
    untimed = bare & (position == 0)  # the utterance's opening boundary has no time
    text_frames = tf.where(untimed, tf.int32.max, tf.cast(frames, tf.int32))
    first = per_word(tf.math.unsorted_segment_min, text_frames)
    last = per_word(tf.math.unsorted_segment_max, frames)
    lowest = per_word(tf.math.unsorted_segment_min, token_log_probs)
    # Keep the words with text, packed to the front of their row.
    keep = tf.reshape(text != "", [batch, slots])
    order = tf.argsort(tf.cast(~keep, tf.int32), axis=1, stable=True)
    word_counts = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)
    width = tf.reduce_max(tf.concat([word_counts, [0]], 0))
    take = order[:, :width]
    filled = tf.range(width)[None, :] < word_counts[:, None]
    packed_index = tf.cumsum(tf.cast(keep, tf.int32), axis=1) - 1
    token_word = tf.gather(packed_index, tf.maximum(index, 0), batch_dims=1)
    token_kept = tf.gather(keep, tf.maximum(index, 0), batch_dims=1)

    def pack(values, empty):
        packed = tf.gather(tf.reshape(values, [batch, slots]), take, batch_dims=1)
        return tf.where(filled, packed, empty)

    starts = pack(clock.seconds(first), 0.0)
    last_times = pack(clock.seconds(last), 0.0)
    words = pack(text, "")
    has_next = tf.range(width)[None, :] + 1 < word_counts[:, None]
    next_starts = tf.where(has_next, tf.pad(starts[:, 1:], [[0, 0], [0, 1]]), float("inf"))
    spoken = starts + _spoken_seconds(words, starts, word_counts)
    ends = tf.maximum(tf.minimum(tf.maximum(last_times + clock.period, spoken), next_starts),
                      last_times)  # fmt: skip
    return {
        "words": words,
        "word_starts": starts,
        "word_ends": tf.where(filled, ends, 0.0),
        "word_confidence": pack(tf.exp(lowest), 0.0),
        "word_counts": word_counts,
        "token_words": tf.where(valid & token_kept, token_word, -1),
    }


@dataclass(frozen=True)
class Alignment:
    """A hypothesis' timed words, and the word each of its tokens belongs to (-1: none)."""

    words: list[Word]
    token_words: list[int]


def align(hypotheses, pieces: list[str], clock: FrameClock) -> list[Alignment]:
    """The timed words of each `Hypothesis` (eagerly, through the same ops as the graph)."""
    if not hypotheses:
        return []
    width = max(1, *(len(h.tokens) for h in hypotheses))

    def padded(field, fill, dtype):
        rows = [list(getattr(h, field)) + [fill] * (width - len(h.tokens)) for h in hypotheses]
        return tf.constant(rows, dtype)

    found = timed_words(
        padded("tokens", -1, tf.int32),
        padded("frames", -1, tf.int32),
        padded("token_log_probs", 0.0, tf.float32),
        tf.constant([len(h.tokens) for h in hypotheses], tf.int32),
        tf.constant(pieces),
        clock,
    )
    found = {key: value.numpy() for key, value in found.items()}
    return [
        Alignment(row_words(found, row), found["token_words"][row, : len(h.tokens)].tolist())
        for row, h in enumerate(hypotheses)
    ]


def row_words(found: dict, row: int) -> list[Word]:
    """The words of one row of `timed_words`' output (NumPy arrays; also an export's)."""
    return [
        Word(
            found["words"][row, i].decode(),
            float(found["word_starts"][row, i]),
            float(found["word_ends"][row, i]),
            float(found["word_confidence"][row, i]),
        )
        for i in range(int(found["word_counts"][row]))
    ]
