"""Timed words against a plain-Python grouping, and token times against the encoder's
actual receptive field."""

import math
import random

import numpy as np
import pytest
import tensorflow as tf

from asrkit.config import FeatureConfig
from asrkit.decoding.formats import CUE_BREAK_SECONDS, as_srt
from asrkit.decoding.search.front import Hypothesis
from asrkit.decoding.words import (
    SECONDS_PER_CHARACTER,
    FrameClock,
    Word,
    align,
    detokenize,
    timed_words,
)
from asrkit.models.subsampling import ConvSubsampling

# A piece table like `Tokenizer.surface_pieces`: blank, a bare boundary, word-initial
# pieces, continuations, and the unknown piece.
PIECES = ["", " ", " the", " a", "b", "cd", " e", "f", " \u2047 ", "g"]


def python_words(tokens, frames, log_probs, clock):
    """Words by reading the pieces left to right (the definition in asrkit.decoding.words)."""
    words = []  # [text, first timed frame, last frame, lowest log-prob]
    for i, (token, frame, log_prob) in enumerate(zip(tokens, frames, log_probs, strict=True)):
        piece = PIECES[token]
        after_bare = i > 0 and PIECES[tokens[i - 1]].strip() == ""
        if i == 0 or (piece[:1] == " " and not after_bare):
            words.append([piece, None, frame, log_prob])
        else:
            words[-1][0] += piece
            words[-1][2] = frame
            words[-1][3] = min(words[-1][3], log_prob)
        if (piece.strip() or i > 0) and words[-1][1] is None:  # the opening "▁" has no time
            words[-1][1] = frame
    kept = [
        (" ".join(text.split()).upper(), clock.offset + first * clock.period,
         clock.offset + last * clock.period, math.exp(low))
        for text, first, last, low in words
        if text.strip()
    ]  # fmt: skip
    # A word lasts its characters at the utterance's pace (the characters and spaces from
    # the first word's start to the last's over that time; 65 ms each with fewer than three
    # words), at least until one frame after its last token, but not past the next word's
    # start (nor before its own last token).
    pace = SECONDS_PER_CHARACTER
    if len(kept) >= 3 and kept[-1][1] > kept[0][1]:
        pace = (kept[-1][1] - kept[0][1]) / sum(len(k[0]) + 1 for k in kept[:-1])
    out = []
    for i, (text, start, last_time, confidence) in enumerate(kept):
        end = max(last_time + clock.period, start + len(text) * pace)
        if i + 1 < len(kept):
            end = min(end, kept[i + 1][1])
        out.append((text, start, max(end, last_time), confidence))
    return out


def test_timed_words_equal_a_plain_python_grouping():
    clock = FrameClock.of(FeatureConfig())
    rng = random.Random(0)
    hyps = []
    for _ in range(40):
        n = rng.randint(0, 12)
        tokens = [rng.randrange(1, len(PIECES)) for _ in range(n)]
        frames = sorted(rng.randrange(0, 50) for _ in range(n))
        log_probs = [math.log(rng.uniform(0.05, 1.0)) for _ in range(n)]
        hyps.append(Hypothesis(tokens, frames, 0.0, "", log_probs))
    found = align(hyps, PIECES, clock)
    checked_words = 0
    for hyp, alignment in zip(hyps, found, strict=True):
        expected = python_words(hyp.tokens, hyp.frames, hyp.token_log_probs, clock)
        assert [w.text for w in alignment.words] == [e[0] for e in expected]
        for word, (_, start, end, confidence) in zip(alignment.words, expected, strict=True):
            assert (word.start, word.end) == pytest.approx((start, end), abs=1e-5)
            assert word.confidence == pytest.approx(confidence, rel=1e-5)
        # Joined with spaces, the words are the hypothesis' text (`Tokenizer.decode`).
        text = " ".join("".join(PIECES[t] for t in hyp.tokens).split()).upper()
        assert " ".join(w.text for w in alignment.words) == text
        # Every token of a kept word points at it; tokens of a bare trailing boundary at -1.
        for token, word in zip(hyp.tokens, alignment.token_words, strict=True):
            assert word == -1 or PIECES[token] == " " or alignment.words[word].text
        checked_words += len(alignment.words)
    assert checked_words > 100


def test_a_one_piece_word_lasts_its_characters_at_the_utterances_pace():
    """Four one-piece words at frames 0, 10, 20, 40: each lasts its characters at the pace
    of the utterance (not the 40 ms of one frame), up to the next word's start."""
    clock = FrameClock.of(FeatureConfig())
    pieces = ["", " alpha", " be", " gamma", " delta"]
    [alignment] = align([Hypothesis([1, 2, 3, 4], [0, 10, 20, 40], 0.0, "", [0.0] * 4)],
                        pieces, clock)  # fmt: skip
    starts = [clock.offset + f * clock.period for f in (0, 10, 20, 40)]
    pace = (starts[-1] - starts[0]) / (6 + 3 + 6)  # ALPHA BE GAMMA, a space after each
    want_ends = [min(starts[0] + 5 * pace, starts[1]), starts[1] + 2 * pace,
                 starts[2] + 5 * pace, starts[3] + 5 * pace]  # fmt: skip
    assert [w.start for w in alignment.words] == pytest.approx(starts, abs=1e-5)
    assert [w.end for w in alignment.words] == pytest.approx(want_ends, abs=1e-5)
    assert all(w.end - w.start > 2 * clock.period for w in alignment.words)


def _word(text, start, end):
    return Word(text, start, end, 1.0)


def test_subtitles_break_at_a_pause_between_sentences():
    """Gaps inside a sentence stay in one cue; a pause of CUE_BREAK_SECONDS starts another
    (a sentence pause of 0.6 s of silence measured 0.75 s between the words around it)."""
    from asrkit.decoding.transcribe import Transcript

    words = [_word("ONE", 0.0, 0.3), _word("TWO", 0.45, 0.8), _word("THREE", 0.9, 1.3),
             _word("FOUR", 1.3 + CUE_BREAK_SECONDS, 2.4), _word("FIVE", 2.5, 2.9)]  # fmt: skip
    hypothesis = Hypothesis([], [], 0.0, "ONE TWO THREE FOUR FIVE", [])
    cues = as_srt(Transcript("a.wav", hypothesis, words, [], 3.0)).strip().split("\n\n")
    assert [c.splitlines()[2] for c in cues] == ["ONE TWO THREE", "FOUR FIVE"]
    assert 0.3 < CUE_BREAK_SECONDS <= 0.6


def test_detokenize_equals_joined_pieces_over_a_beam():
    rng = np.random.default_rng(1)
    tokens = rng.integers(1, len(PIECES), size=(3, 4, 9)).astype(np.int32)
    counts = rng.integers(0, 10, size=(3, 4)).astype(np.int32)
    tokens = np.where(np.arange(9) < counts[..., None], tokens, -1)
    texts = detokenize(tf.constant(tokens), tf.constant(counts), tf.constant(PIECES)).numpy()
    for b in range(3):
        for k in range(4):
            joined = "".join(PIECES[t] for t in tokens[b, k, : counts[b, k]])
            assert texts[b, k].decode() == " ".join(joined.split()).upper()


def test_a_token_time_is_the_centre_of_its_encoder_frame_audio():
    """The subsampling's real receptive field: encoder frame t depends on feature frames
    4t .. 4t+6 (gradients), feature frame i on samples [i·hop, i·hop + window); the clock
    puts frame t at the centre of those samples."""
    features = FeatureConfig()
    layer = ConvSubsampling(filters=8, output_dim=16)
    x = tf.random.normal([1, 40, features.num_mel_bins])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y, _ = layer(x, tf.constant([40]))
        rows = {t: tf.reduce_sum(y[0, t]) for t in (0, 3, 7)}
    clock = FrameClock.of(features)
    rate = features.sample_rate
    for t, row in rows.items():
        grad = tape.gradient(row, x)[0].numpy()
        used = np.flatnonzero(np.abs(grad).sum(axis=1) > 0)
        first_sample = used[0] * features.frame_step
        last_sample = used[-1] * features.frame_step + features.frame_length
        assert clock.seconds(t).numpy() == pytest.approx(
            (first_sample + last_sample) / 2 / rate, abs=1e-6
        )


def test_empty_hypotheses_have_no_words():
    clock = FrameClock.of(FeatureConfig())
    found = timed_words(
        tf.fill([2, 3], -1), tf.fill([2, 3], -1), tf.zeros([2, 3]), tf.constant([0, 0]),
        tf.constant(PIECES), clock,
    )  # fmt: skip
    assert found["word_counts"].numpy().tolist() == [0, 0]
    assert found["words"].shape == (2, 0)
