"""TDT beam search against an exhaustive enumeration of its search space and against
greedy search (beam 1)."""

import dataclasses
import math

import numpy as np
import pytest
import tensorflow as tf

from asrkit.decoding.search.beam import live_slots
from asrkit.decoding.search.tdt_beam import tdt_beam_search
from asrkit.decoding.search.tdt_greedy import tdt_greedy_search
from asrkit.models.transducer import Transducer
from asrkit.tokenizer import BLANK_ID
from tests.tiny import tiny_model_config


def tdt_transducer(vocab_size, durations, seed):
    tf.keras.utils.set_random_seed(seed)
    config = dataclasses.replace(tiny_model_config(), durations=tuple(durations))
    model = Transducer(vocab_size, config)
    model.build_from_features(80)
    bias = model.joint.output_layer.bias  # away from blank: the untrained model emits
    bias.assign(bias.numpy() + np.r_[-1.0, np.zeros(vocab_size - 1)])
    return model


def every_sequence(model, encoded, length, max_symbols):
    """{token sequence: log P} summed over every path of the search's decisions
    (float64), by recursion over (frame, tokens emitted there, tokens so far)."""
    durations = model.config.durations
    predicted = {}

    def predictor_after(tokens):
        if tokens not in predicted:
            if tokens:
                _, state = predictor_after(tokens[:-1])
                predicted[tokens] = model.predictor.step(tf.constant([tokens[-1]]), state)
            else:
                initial = model.predictor.initial_state(1)
                predicted[tokens] = model.predictor.step(tf.constant([BLANK_ID]), initial)
        return predicted[tokens]

    found = {}

    def walk(t, run, tokens, log_p):
        if t >= length:
            found[tokens] = np.logaddexp(found.get(tokens, -np.inf), log_p)
            return
        out, _ = predictor_after(tokens)
        token_logits, duration_logits = model.joint.tokens_and_durations(encoded[t][None], out)
        log_probs = tf.nn.log_softmax(tf.cast(token_logits[0], tf.float64)).numpy()
        duration_log_probs = tf.nn.log_softmax(tf.cast(duration_logits[0], tf.float64)).numpy()
        for v, lp in enumerate(log_probs):
            for d, dlp in zip(durations, duration_log_probs, strict=True):
                p = log_p + lp + dlp
                if v == BLANK_ID:
                    walk(t + max(d, 1), 0, tokens, p)
                elif d > 0:
                    walk(t + d, 0, (*tokens, v), p)
                elif run + 1 >= max_symbols:
                    walk(t + 1, 0, (*tokens, v), p)
                else:
                    walk(t, run + 1, (*tokens, v), p)

    walk(0, 0, (), 0.0)
    return found


@pytest.fixture(scope="module")
def model():
    return tdt_transducer(vocab_size=3, durations=(0, 1, 2), seed=5)


@pytest.mark.parametrize("length", [0, 1, 2, 3])
def test_a_wide_beam_sums_every_path_of_every_sequence(model, length):
    rng = np.random.default_rng(length)
    encoded = tf.constant(rng.standard_normal((1, 3, 16)), tf.float32)
    found = tdt_beam_search(model, encoded, tf.constant([length]), beam=640, max_symbols_per_step=2)
    alive = live_slots(found.scores).numpy()[0]
    beam = {
        tuple(found.tokens[0, k, : found.counts[0, k]].numpy().tolist()): float(found.scores[0, k])
        for k in np.flatnonzero(alive)
    }
    want = every_sequence(model, encoded[0], length, max_symbols=2)
    assert len(want) < 640 and sorted(beam) == sorted(want)
    for tokens, log_p in want.items():
        assert beam[tokens] == pytest.approx(log_p, abs=2e-4), tokens
    assert math.isclose(np.logaddexp.reduce(list(want.values())), 0.0, abs_tol=1e-9)  # all paths
    scores = found.scores.numpy()[0][alive]
    assert list(scores) == sorted(scores, reverse=True)  # best first


@pytest.mark.parametrize("max_symbols", [1, 3])
def test_beam_one_is_greedy_search(max_symbols):
    model = tdt_transducer(vocab_size=7, durations=(0, 1, 2, 3, 4), seed=2)
    lengths = [9, 14, 1, 0, 12]
    rng = np.random.default_rng(1)
    encoded = tf.constant(rng.standard_normal((5, 14, 16)), tf.float32)
    beam = tdt_beam_search(model, encoded, tf.constant(lengths), 1, max_symbols)
    greedy = tdt_greedy_search(model, encoded, tf.constant(lengths), max_symbols)
    np.testing.assert_array_equal(beam.counts[:, 0], greedy.counts)
    assert int(tf.reduce_sum(greedy.counts)) > 10  # the untrained model does emit
    for row in range(len(lengths)):
        n = int(greedy.counts[row])
        np.testing.assert_array_equal(beam.tokens[row, 0, :n], greedy.tokens[row, :n])
        np.testing.assert_array_equal(beam.frames[row, 0, :n], greedy.frames[row, :n])
    np.testing.assert_allclose(beam.scores[:, 0], greedy.scores, rtol=1e-5, atol=1e-5)


def test_rows_of_a_batch_search_as_they_would_alone(model):
    lengths = [3, 1, 2]
    rng = np.random.default_rng(7)
    encoded = tf.constant(rng.standard_normal((3, 3, 16)), tf.float32)
    together = tdt_beam_search(model, encoded, tf.constant(lengths), beam=3)
    for row, n in enumerate(lengths):
        alone = tdt_beam_search(model, encoded[row : row + 1, :n], tf.constant([n]), beam=3)
        np.testing.assert_allclose(together.scores[row], alone.scores[0], rtol=1e-6)
        np.testing.assert_array_equal(together.counts[row], alone.counts[0])
        for k, count in enumerate(alone.counts[0].numpy()):
            np.testing.assert_array_equal(
                together.tokens[row, k, :count], alone.tokens[0, k, :count]
            )
