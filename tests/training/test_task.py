"""The training task's loss terms: the CTC head's loss adds exactly `loss.ctc_weight` × the
CTC loss of its logits to each utterance (or interpolates, as NeMo's hybrids do), each
`loss.normalize_by` divides as NeMo's reduction of the same name would; dynamic chunk
training uses the chunk of the current update."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.config import EncoderConfig, LossConfig
from asrkit.losses import ctc_losses
from asrkit.models.conformer import dynamic_chunk_frames, lookahead_chunk_frames
from asrkit.models.transducer import Transducer
from asrkit.training.task import TransducerTask
from tests.recording import Recorder
from tests.tiny import tiny_model_config


def _batch(seed: int):
    """Three utterances of 64, 40 and 28 frames with 4, 2 and 1 labels."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((3, 64, 80)).astype(np.float32), np.array([64, 40, 28]),
            np.array([[1, 2, 2, 4], [5, 6, 0, 0], [7, 0, 0, 0]], np.int32),
            np.array([4, 2, 1]))  # fmt: skip


@pytest.mark.parametrize("fused", [True, False])
def test_auxiliary_ctc_adds_its_weighted_loss_to_each_utterance(fused):
    batch = _batch(3)
    keras.utils.set_random_seed(0)
    plain = TransducerTask(Transducer(9, tiny_model_config()), LossConfig(fused=fused))
    hybrid = dataclasses.replace(tiny_model_config(), ctc_head=True)
    with_ctc = TransducerTask(Transducer(9, hybrid), LossConfig(fused=fused, ctc_weight=0.4))
    nemo_like = TransducerTask(
        Transducer(9, hybrid), LossConfig(fused=fused, ctc_weight=0.4, ctc_interpolate=True)
    )
    for task in (plain, with_ctc, nemo_like):
        task.build_heads(80)
    nemo_like.network.set_weights(with_ctc.network.get_weights())
    for mine, theirs in zip(plain.network.weights, with_ctc.network.weights, strict=False):
        mine.assign(theirs)  # the hybrid's weights are the plain one's + the head's two
    # The head is the network's: decoding (`--method ctc`) and export have it.
    assert plain.network.ctc_head is None and with_ctc.network.ctc_head is not None
    assert len(with_ctc.network.weights) == len(plain.network.weights) + 2
    base, count = plain.compute_loss_terms(batch, training=False)
    total, same_count = with_ctc.compute_loss_terms(batch, training=False)
    interpolated, _ = nemo_like.compute_loss_terms(batch, training=False)
    encoded, lengths = with_ctc.network.encode(batch[0], batch[1])
    ctc = ctc_losses(with_ctc.network.ctc_logits(encoded), batch[2], lengths, batch[3], blank=0)
    ctc = float(tf.reduce_sum(ctc))
    assert int(count) == int(same_count) == 7
    assert ctc > 0
    assert float(total) == pytest.approx(float(base) + 0.4 * ctc, rel=1e-5)
    assert float(interpolated) == pytest.approx(0.6 * float(base) + 0.4 * ctc, rel=1e-5)


@pytest.mark.parametrize("normalize_by", ["tokens", "utterances", "utterance_tokens"])
def test_each_normalisation_is_nemos_reduction_of_the_same_batch(normalize_by):
    """(sum, count) of a batch divided as the engine divides them = NeMo's reduction
    (mean_volume, mean_batch, mean) of the per-utterance losses, in NumPy."""
    batch = _batch(5)
    keras.utils.set_random_seed(0)
    task = TransducerTask(Transducer(9, tiny_model_config()), LossConfig(normalize_by=normalize_by))
    task.build_heads(80)
    total, count = task.compute_loss_terms(batch, training=False)
    per_utterance = TransducerTask(task.network, LossConfig(normalize_by="utterances"))
    losses = np.array([
        float(per_utterance.compute_loss_terms(tuple(x[i : i + 1] for x in batch))[0])
        for i in range(3)
    ])  # fmt: skip
    tokens = batch[3]
    want = {"tokens": losses.sum() / tokens.sum(), "utterances": losses.mean(),
            "utterance_tokens": (losses / tokens).mean()}[normalize_by]  # fmt: skip
    assert float(total) / float(count) == pytest.approx(want, rel=1e-5)


def test_dynamic_chunks_train_each_update_with_that_updates_chunk():
    """With model.encoder.dynamic_chunks the training loss at update u is the loss of the
    same weights configured with the chunk `dynamic_chunk_frames(u)` draws (0: full
    context); evaluation uses the configured chunk."""
    rng = np.random.default_rng(4)
    batch = (rng.standard_normal((2, 120, 80)).astype(np.float32), np.array([120, 77]),
             np.array([[1, 2, 3], [4, 5, 0]], np.int32), np.array([3, 2]))  # fmt: skip
    encoder = EncoderConfig(kind="conformer", d_model=16, num_blocks=2, num_heads=2,
                            kernel_size=5, subsampling_filters=8, dropout=0.0,
                            chunk_frames=4)  # fmt: skip
    dynamic_config = dataclasses.replace(
        tiny_model_config(), encoder=dataclasses.replace(encoder, dynamic_chunks=6)
    )
    keras.utils.set_random_seed(1)
    task = TransducerTask(Transducer(9, dynamic_config))
    task.compile(keras.optimizers.SGD(0.1))
    task.network.build_from_features(80)

    def fixed_loss(chunk):
        config = dataclasses.replace(
            dynamic_config, encoder=dataclasses.replace(encoder, chunk_frames=chunk or 10_000)
        )
        other = TransducerTask(Transducer(9, config))
        other.network.build_from_features(80)
        other.network.set_weights(task.network.get_weights())
        return float(other.compute_loss_terms(batch, training=True)[0])

    drawn = {}
    for updates in range(12):
        task.optimizer.iterations.assign(updates)
        drawn.setdefault(int(dynamic_chunk_frames(updates, 6)), updates)
    assert 0 in drawn and len(drawn) >= 3, drawn
    for chunk, updates in drawn.items():
        task.optimizer.iterations.assign(updates)
        got = float(task.compute_loss_terms(batch, training=True)[0])
        assert got == pytest.approx(fixed_loss(chunk), rel=1e-5), chunk
    assert float(task.compute_loss_terms(batch, training=False)[0]) == pytest.approx(
        fixed_loss(4), rel=1e-5
    )


def test_several_look_aheads_train_each_update_with_the_one_it_draws():
    """With model.encoder.lookaheads (NeMo's multi look-ahead training) the training loss at
    update u is the loss of the same weights configured with the look-ahead
    `lookahead_chunk_frames(u)` draws, the left context kept in frames (NeMo's); every
    look-ahead is drawn; evaluation uses the first."""
    rng = np.random.default_rng(5)
    batch = (rng.standard_normal((2, 160, 80)).astype(np.float32), np.array([160, 97]),
             np.array([[1, 2, 3], [4, 5, 0]], np.int32), np.array([3, 2]))  # fmt: skip
    lookaheads = (3, 7, 1, 0)
    encoder = EncoderConfig(kind="conformer", d_model=16, num_blocks=2, num_heads=2,
                            kernel_size=5, subsampling_filters=8, dropout=0.0,
                            subsampling="dw_striding", subsampling_factor=8,
                            causal_subsampling=True, conv_context="causal", chunk_frames=4,
                            left_chunks=2, lookaheads=lookaheads)  # fmt: skip
    config = dataclasses.replace(tiny_model_config(), encoder=encoder)
    keras.utils.set_random_seed(1)
    task = TransducerTask(Transducer(9, config))
    task.compile(keras.optimizers.SGD(0.1))
    task.network.build_from_features(80)

    def fixed_loss(lookahead, training=True):
        chunk = lookahead + 1
        left = dataclasses.replace(encoder, chunk_frames=chunk, left_chunks=8 // chunk,
                                   lookaheads=())  # fmt: skip
        other = TransducerTask(Transducer(9, dataclasses.replace(config, encoder=left)))
        other.network.build_from_features(80)
        other.network.set_weights(task.network.get_weights())
        return float(other.compute_loss_terms(batch, training=training)[0])

    drawn = {}
    for updates in range(16):
        drawn.setdefault(int(lookahead_chunk_frames(updates, lookaheads)) - 1, updates)
    assert sorted(drawn) == sorted(lookaheads), drawn
    losses = set()
    for lookahead, updates in drawn.items():
        task.optimizer.iterations.assign(updates)
        got = float(task.compute_loss_terms(batch, training=True)[0])
        assert got == pytest.approx(fixed_loss(lookahead), rel=1e-5), lookahead
        losses.add(round(got, 4))
    assert len(losses) == len(lookaheads)  # the look-ahead changes the loss
    evaluated = float(task.compute_loss_terms(batch, training=False)[0])
    assert evaluated == pytest.approx(fixed_loss(3, training=False), rel=1e-5)


def test_the_pruned_loss_is_the_same_fused_or_plain():
    """`loss.fused` with `loss.kind: pruned` (the simple loss' projection and
    the band chunk by chunk) = the plain pruned loss: the loss and every variable's
    gradient, smoothing on."""
    rng = np.random.default_rng(4)
    batch = (rng.standard_normal((3, 64, 80)).astype(np.float32),
             np.array([64, 40, 28], np.int32),
             np.array([[1, 2, 2, 4], [5, 6, 0, 0], [7, 0, 0, 0]], np.int32),
             np.array([4, 2, 1], np.int32))  # fmt: skip
    loss = LossConfig(kind="pruned", prune_range=2, lm_only_scale=0.25, am_only_scale=0.1,
                      pruned_chunk_mb=0.01)  # fmt: skip
    results, weights = [], None
    for fused in (False, True):
        keras.utils.set_random_seed(0)
        task = TransducerTask(
            Transducer(9, tiny_model_config(predictor="stateless")),
            dataclasses.replace(loss, fused=fused),
        )
        task.build_heads(80)
        weights = weights or [v.numpy() for v in task.trainable_variables]
        for variable, value in zip(task.trainable_variables, weights, strict=True):
            variable.assign(value)
        with tf.GradientTape() as tape:
            total, _ = task.compute_loss_terms(batch, training=False)
        variables = task.trainable_variables
        results.append([total, *tape.gradient(total, variables)])
    assert len(results[1]) > 10
    for got, want in zip(results[1], results[0], strict=True):
        got, want = tf.convert_to_tensor(got), tf.convert_to_tensor(want)  # embeddings: slices
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


def _rows(batch, rows):
    features, lengths, labels, label_lengths = batch
    return features[rows], lengths[rows], labels[rows], label_lengths[rows]


def _padded_union(parts):
    frames = max(p[0].shape[1] for p in parts)
    width = max(p[2].shape[1] for p in parts)
    return (
        np.concatenate(
            [np.pad(p[0], ((0, 0), (0, frames - p[0].shape[1]), (0, 0))) for p in parts]
        ),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([np.pad(p[2], ((0, 0), (0, width - p[2].shape[1]))) for p in parts]),
        np.concatenate([p[3] for p in parts]),
    )


def test_a_ctc_loss_divided_by_utterances_beside_tokens_is_exact_over_a_window():
    """NeMo's hybrid reductions (the transducer's sum over the tokens, the CTC's over the
    utterances): the loss of a batch is (1 - w) Σ transducer / tokens + w Σ CTC / utterances
    (the plain task's sum and `ctc_losses`, independently), and a window of three
    micro-batches whose tokens-per-utterance differ (4, 1.5, 2.33) applies, variable by
    variable, the gradient of their union — the CTC head's too, whose whole gradient is
    the CTC term's."""
    hybrid = dataclasses.replace(tiny_model_config(), ctc_head=True)
    mixed = LossConfig(ctc_weight=0.4, ctc_interpolate=True, ctc_normalize_by="utterances")
    keras.utils.set_random_seed(0)
    task = TransducerTask(Transducer(9, hybrid), mixed)
    task.build_heads(80)
    plain = TransducerTask(Transducer(9, hybrid), LossConfig())
    plain.build_heads(80)
    plain.network.set_weights(task.network.get_weights())
    batch = _batch(3)
    total, count = task.compute_loss_terms(batch, training=False)
    transducer, tokens = plain.compute_loss_terms(batch, training=False)
    encoded, lengths = task.network.encode(batch[0], batch[1])
    ctc = ctc_losses(task.network.ctc_logits(encoded), batch[2], lengths, batch[3], blank=0)
    want = 0.6 * float(transducer) / int(tokens) + 0.4 * float(tf.reduce_sum(ctc)) / 3
    assert int(count) == int(tokens) == 7
    assert float(total) / int(count) == pytest.approx(want, rel=1e-5)

    other = _batch(4)
    parts = [_rows(batch, slice(0, 1)), _rows(batch, slice(1, 3)), other]
    applied = {}
    for name, steps, data in (("window", 3, parts), ("union", 1, [_padded_union(parts)])):
        keras.utils.set_random_seed(0)
        run = TransducerTask(Transducer(9, hybrid), mixed)
        run.build_heads(80)
        run.network.set_weights(task.network.get_weights())
        recorder = Recorder(learning_rate=1.0, name="recorder")
        run.compile(recorder, accumulation_steps=steps, clip_global_norm=None)
        spec = tuple(tf.TensorSpec([None] * (x.ndim - 1) + [x.shape[-1] if x.ndim == 3 else None],
                                   tf.as_dtype(x.dtype)) for x in data[0])  # fmt: skip
        dataset = tf.data.Dataset.from_generator(lambda data=data: iter(data),
                                                 output_signature=spec)  # fmt: skip
        run.fit(dataset, epochs=1, verbose=0)
        applied[name] = [v.numpy() for v in recorder.seen]
        names = [v.path for v in run.trainable_variables]
    for name, got, want in zip(names, applied["window"], applied["union"], strict=True):
        assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want) + 1e-9, name
    assert any("ctc" in name for name in names)
