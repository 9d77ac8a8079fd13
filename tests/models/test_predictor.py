"""Predictors: training over whole label sequences == stepping one label at a time, and the
stateless predictor == its definition written out in NumPy."""

import numpy as np
import pytest
import tensorflow as tf

from asrkit.models.predictor import LSTMPredictor, StatelessPredictor
from asrkit.tokenizer import BLANK_ID

LABELS = np.array([[3, 4, 5, 9, 2], [6, 7, 1, 0, 0]], np.int32)


def numpy_stateless(predictor: StatelessPredictor, labels: np.ndarray) -> np.ndarray:
    """out[b, u] = relu(concat(E[y[u-C+1]], ..., E[y[u]]) W + b), y[0] = blank, y[<0] = blank."""
    table = predictor.embedding.embeddings.numpy()
    kernel, bias = (w.numpy() for w in predictor.context.weights)
    c = predictor.context_size
    out = np.zeros((*labels.shape[:1], labels.shape[1] + 1, predictor.units), np.float32)
    for b, row in enumerate(labels):
        sequence = [BLANK_ID] * c + list(row)  # position u+c-1 holds the u-th input
        for u in range(len(row) + 1):
            window = sequence[u : u + c]
            x = np.concatenate([table[t] for t in window])
            out[b, u] = np.maximum(x @ kernel + bias, 0.0)
    return out


@pytest.mark.parametrize("context", [1, 2, 3])
def test_stateless_predictor_is_its_definition(context):
    predictor = StatelessPredictor(
        vocab_size=10, embed_dim=4, units=6, context_size=context, dropout=0.0
    )
    out = predictor(LABELS).numpy()
    np.testing.assert_allclose(out, numpy_stateless(predictor, LABELS), atol=1e-5)
    # Only the last `context` labels matter: changing an older one changes nothing after.
    changed = LABELS.copy()
    changed[0, 0] = 8
    delta = np.abs(predictor(changed).numpy() - out)[0].max(axis=-1)
    assert (delta[1 : 1 + context] > 0).all() and (delta[1 + context :] == 0).all()


@pytest.mark.parametrize(
    "factory",
    [lambda: LSTMPredictor(vocab_size=10, embed_dim=4, units=6, num_layers=2, dropout=0.0),
     lambda: StatelessPredictor(vocab_size=10, embed_dim=4, units=6, context_size=2, dropout=0.0)],
    ids=["lstm", "stateless"],
)  # fmt: skip
def test_stepping_one_label_at_a_time_equals_the_training_call(factory):
    predictor = factory()
    whole = predictor(LABELS).numpy()
    state = predictor.initial_state(2)
    out, state = predictor.step(tf.fill([2], BLANK_ID), state)
    stepped = [out.numpy()]
    for u in range(LABELS.shape[1]):
        out, state = predictor.step(tf.constant(LABELS[:, u]), state)
        stepped.append(out.numpy())
    np.testing.assert_allclose(np.stack(stepped, axis=1), whole, atol=1e-5)


@pytest.mark.parametrize("input_bias", [False, True])
def test_the_lstm_sequence_and_its_written_gradient_equal_the_keras_layers(input_bias):
    """The training call (input projections in one product, the recurrence with its
    backpropagation through time written out) gives the outputs and every weight's gradient
    of running Keras' own LSTM layers over the sequence, eagerly and traced."""
    predictor = LSTMPredictor(vocab_size=12, embed_dim=6, units=5, num_layers=2, dropout=0.0,
                              input_bias=input_bias)  # fmt: skip
    predictor(LABELS)
    rng = np.random.default_rng(1)
    for weight in predictor.weights:  # biases away from zero too
        weight.assign(rng.normal(0.0, 0.5, weight.shape).astype(np.float32))
    projection = tf.constant(rng.standard_normal((2, 6, 5)).astype(np.float32))

    def keras_layers(labels):
        x = predictor._embed(tf.concat([tf.fill([2, 1], BLANK_ID), labels], axis=1))
        for lstm in predictor.lstms:
            x, _, _ = lstm(x)
        return x

    def loss_and_gradients(run):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(run(tf.constant(LABELS)) * projection)
        return loss, tape.gradient(loss, predictor.trainable_variables)

    want_loss, want = loss_and_gradients(keras_layers)
    for run in (predictor, tf.function(predictor, autograph=False)):
        np.testing.assert_allclose(run(LABELS), keras_layers(tf.constant(LABELS)), atol=1e-6)
        loss, got = loss_and_gradients(run)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
        for g, w, variable in zip(got, want, predictor.trainable_variables, strict=True):
            np.testing.assert_allclose(tf.convert_to_tensor(g), tf.convert_to_tensor(w),
                                       rtol=1e-5, atol=1e-6, err_msg=variable.path)  # fmt: skip
