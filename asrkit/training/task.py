"""The training *task* around a transducer network: its loss (RNN-T, pruned RNN-T or TDT,
with an auxiliary CTC loss) and the accumulation engine (keras-hub's Task around a Backbone).

The task owns the loss (`LossConfig`, the config's `loss:` section) and the heads it needs
(`LossHeads`); the network carries only its architecture (a hybrid network's CTC head
included). `compute_loss_terms` returns (Σ per-utterance losses, count) — each utterance's
transducer loss combined with its CTC loss by `loss.ctc_weight` (added, or interpolated as
NeMo's hybrids do) — with the count set by `loss.normalize_by`: tokens (Σ label_lengths),
utterances, or utterances with each loss first divided by its own tokens. `loss.kind` picks
the transducer loss (`TRANSDUCER_LOSSES`): the full RNN-T loss, k2's pruned loss or the TDT
loss, each fused with the joint's output layer chunk by chunk under `loss.fused`; the
encoder is any `asrkit.models.encoder.Encoder`. `fit` on the task is the user's training
API; `task.network` is what decoding, export and fine-tuning use.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from asrkit.config import LossConfig
from asrkit.losses import (
    ctc_losses,
    fused_pruned_loss,
    fused_rnnt_loss,
    fused_simple_loss,
    fused_tdt_loss,
    loss_scales,
    prune_ranges,
    pruned_loss,
    rnnt_loss,
    simple_loss,
    tdt_loss,
)
from asrkit.models.conformer import dynamic_chunk_frames, lookahead_chunk_frames
from asrkit.models.joint import SimpleJoiner
from asrkit.models.layers import CompositeLayer
from asrkit.models.transducer import Transducer, dummy_batch
from asrkit.tokenizer import BLANK_ID
from asrkit.training.accumulation import AccumulatingModel


@keras.saving.register_keras_serializable(package="asrkit")
class LossHeads(CompositeLayer):
    """What a loss adds to the network for training only: the pruned loss' trivial joiner
    (`simple`; None for the other losses). Checkpoints keep it under `loss_heads.`;
    inference never builds it. (A CTC head is part of the network: `model.ctc_head`.)"""

    def __init__(self, *, vocab_size: int, loss: LossConfig | dict, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.loss = LossConfig(**loss) if isinstance(loss, dict) else loss
        pruned = self.loss.kind == "pruned"
        self.simple = SimpleJoiner(vocab_size=vocab_size, name="simple") if pruned else None

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size,
                "loss": dataclasses.asdict(self.loss)}  # fmt: skip


@keras.saving.register_keras_serializable(package="asrkit")
class TransducerTask(AccumulatingModel):
    def __init__(self, network: Transducer | dict, loss: LossConfig | dict | None = None, **kwargs):
        super().__init__(**kwargs)
        if isinstance(network, dict):
            network = keras.saving.deserialize_keras_object(network)
        self.network = network  # first: the optimizer's variable order is network, then heads
        loss = LossConfig() if loss is None else loss
        self.heads = LossHeads(vocab_size=network.vocab_size, loss=loss, name="loss_heads")
        self.loss_config = self.heads.loss

    def call(self, batch, training=False):
        return self.network(batch, training=training)

    def build_heads(self, num_mel_bins: int) -> None:
        """Builds the network and the loss' heads with one tiny forward pass."""
        network, heads = self.network, self.heads
        network.build_from_features(num_mel_bins)
        if heads.simple is None or heads.simple.built:
            return
        batch = dummy_batch(num_mel_bins)
        encoded, _ = network.encode(batch[0], batch[1])
        heads.simple(encoded, network.predict_labels(batch[2]))

    @property
    def uses_window_counts(self) -> bool:
        """A CTC loss divided by another count than the transducer's (loss.ctc_normalize_by)."""
        loss = self.loss_config
        return loss.ctc_weight > 0 and loss.ctc_normalize_by not in (None, loss.normalize_by)

    def window_counts(self, data):
        """This micro-batch shard's [transducer count, CTC count] (see compute_loss_terms)."""
        label_lengths, loss = data[3], self.loss_config
        zeros = tf.zeros(tf.shape(label_lengths), tf.float32)
        counts = [tf.cast(normalized_terms(zeros, label_lengths, by)[1], tf.float32)
                  for by in (loss.normalize_by, loss.ctc_normalize_by)]  # fmt: skip
        return tf.stack(counts)

    def compute_loss_terms(self, data, training=True, window_counts=None):
        """(Σ item losses, count) of one micro-batch shard. With `uses_window_counts`, the CTC
        sum enters scaled by the window's transducer count over its CTC count
        (`window_counts`, totalled by the engine over the window's micro-batches and
        replicas; this shard's own without them: exact for a window of one micro-batch), so
        that the window's sum over its transducer count is (transducer sum / its count) +
        (CTC sum / its count)."""
        features, feature_lengths, labels, label_lengths = data[:4]
        network, loss = self.network, self.loss_config
        self.build_heads(features.shape[-1])  # the fused path skips the joint's call
        chunk = None
        encoder = network.config.encoder
        if training and encoder.dynamic_chunks:
            chunk = dynamic_chunk_frames(self.updates(), encoder.dynamic_chunks)
        elif training and len(encoder.lookaheads) > 1:
            chunk = lookahead_chunk_frames(self.updates(), encoder.lookaheads)
        encoded, encoder_lengths = network.encode(
            features, feature_lengths, training=training, chunk_frames=chunk
        )
        predicted = network.predict_labels(labels, training=training)
        transducer_loss = TRANSDUCER_LOSSES[loss.kind]
        losses = transducer_loss(self, encoded, predicted, labels, encoder_lengths, label_lengths)
        if loss.ctc_weight > 0:
            ctc = ctc_losses(
                network.ctc_logits(encoded), labels, encoder_lengths, label_lengths,
                blank=BLANK_ID,
            )  # fmt: skip
            kept = 1.0 - loss.ctc_weight if loss.ctc_interpolate else 1.0
            if self.uses_window_counts:
                own, count = normalized_terms(kept * losses, label_lengths, loss.normalize_by)
                ctc_sum, _ = normalized_terms(loss.ctc_weight * ctc, label_lengths,
                                              loss.ctc_normalize_by)  # fmt: skip
                totals = self.window_counts(data) if window_counts is None else window_counts
                ratio = tf.math.divide_no_nan(totals[0], totals[1])
                return own + tf.cast(ratio, own.dtype) * ctc_sum, count
            losses = kept * losses + loss.ctc_weight * ctc
        return normalized_terms(losses, label_lengths, loss.normalize_by)

    def updates(self, default: int = 0):
        """Optimizer updates so far (never micro-batches): what schedules inside the loss
        count in; `default` before the task is compiled."""
        optimizer = getattr(self, "optimizer", None)
        return optimizer.iterations if optimizer is not None else default

    def get_config(self):
        return {
            **super().get_config(),
            "network": keras.saving.serialize_keras_object(self.network),
            "loss": dataclasses.asdict(self.loss_config),
        }


def normalized_terms(losses, label_lengths, normalize_by: str):
    """(Σ of the per-utterance `losses` as the window sums them, this micro-batch's part of
    the window's count) for `loss.normalize_by`; the engine divides the window's sum by its
    whole count, so the window's loss is NeMo's reduction of their union."""
    if normalize_by == "tokens":
        return tf.reduce_sum(losses), tf.reduce_sum(label_lengths)
    if normalize_by == "utterance_tokens":
        tokens = tf.cast(tf.maximum(label_lengths, 1), losses.dtype)
        return tf.reduce_sum(losses / tokens), tf.shape(label_lengths)[0]
    if normalize_by == "utterances":
        return tf.reduce_sum(losses), tf.shape(label_lengths)[0]
    raise ValueError(f"loss.normalize_by {normalize_by!r} does not train (check_trainable)")


def full_losses(task, encoded, predicted, labels, encoder_lengths, label_lengths):
    """The RNN-T loss over the whole lattice, per utterance: fused with the joint's output
    layer chunk by chunk (`loss.fused`), or from the joint's logits (the reference)."""
    joint, loss = task.network.joint, task.loss_config
    if loss.fused:
        enc_h, pred_h = joint.project(encoded, predicted)
        out = joint.output_layer
        return fused_rnnt_loss(
            enc_h, pred_h, labels, encoder_lengths, label_lengths, kernel=out.kernel,
            bias=out.bias, blank=BLANK_ID, chunk_bytes=int(loss.chunk_mb * 2**20),
            delay_penalty=loss.delay_penalty, fastemit_lambda=loss.fastemit_lambda,
            activation=joint.activation,
        )  # fmt: skip
    return rnnt_loss(
        joint(encoded, predicted), labels, encoder_lengths, label_lengths, blank=BLANK_ID,
        delay_penalty=loss.delay_penalty, fastemit_lambda=loss.fastemit_lambda,
    )  # fmt: skip


def pruned_losses(task, encoded, predicted, labels, encoder_lengths, label_lengths):
    """icefall's recipe: simple · simple_loss + pruned · pruned_loss, the weights warmed up
    over optimizer updates (read from the optimizer, so never micro-batches)."""
    joint, config, joiner = task.network.joint, task.loss_config, task.heads.simple
    chunk_bytes = int(config.pruned_chunk_mb * 2**20)
    if config.fused:  # the encoder's projection to V chunk by chunk
        simple, occupancy = fused_simple_loss(
            encoded, joiner.lm_proj(predicted), labels, encoder_lengths, label_lengths,
            kernel=joiner.am_proj.kernel, bias=joiner.am_proj.bias, blank=BLANK_ID,
            lm_only_scale=config.lm_only_scale, am_only_scale=config.am_only_scale,
            chunk_bytes=chunk_bytes,
        )  # fmt: skip
    else:
        am, lm = joiner(encoded, predicted)
        simple, occupancy = simple_loss(
            am, lm, labels, encoder_lengths, label_lengths, blank=BLANK_ID,
            lm_only_scale=config.lm_only_scale, am_only_scale=config.am_only_scale,
        )  # fmt: skip
    s_begin = prune_ranges(
        occupancy, encoder_lengths, label_lengths, prune_range=config.prune_range
    )
    enc_h, pred_h = joint.project(encoded, predicted)
    out = joint.output_layer
    band = dict(s_begin=s_begin, prune_range=config.prune_range, kernel=out.kernel,
                bias=out.bias, blank=BLANK_ID, activation=joint.activation)  # fmt: skip
    if config.fused:
        band["chunk_bytes"] = chunk_bytes
    pruned = (fused_pruned_loss if config.fused else pruned_loss)(
        enc_h, pred_h, labels, encoder_lengths, label_lengths, **band
    )
    updates = task.updates(default=config.warmup_updates)
    simple_weight, pruned_weight = loss_scales(updates, config.warmup_updates, config.simple_scale)
    return simple_weight * simple + pruned_weight * pruned


def tdt_losses(task, encoded, predicted, labels, encoder_lengths, label_lengths):
    """The TDT loss of a joint with duration outputs (`model.durations`), fused with the
    joint chunk by chunk (`loss.fused`) or from its whole logits. With `loss.omega`, the
    RNN-T loss of the token logits instead with that probability, as NeMo trains; drawn
    once per optimizer update (from the update count), so every micro-batch of a window
    takes the same loss and accumulation stays exact."""
    joint, config = task.network.joint, task.loss_config
    durations = task.network.config.durations

    def tdt():
        if config.fused:
            enc_h, pred_h = joint.project(encoded, predicted)
            out, dur = joint.output_layer, joint.duration_layer
            return fused_tdt_loss(
                enc_h, pred_h, labels, encoder_lengths, label_lengths, kernel=out.kernel,
                bias=out.bias, duration_kernel=dur.kernel, duration_bias=dur.bias,
                durations=durations, blank=BLANK_ID, sigma=config.sigma,
                chunk_bytes=int(config.chunk_mb * 2**20), activation=joint.activation,
            )  # fmt: skip
        token_logits, duration_logits = joint.tokens_and_durations(encoded, predicted)
        return tdt_loss(
            token_logits, duration_logits, labels, encoder_lengths, label_lengths,
            durations=durations, blank=BLANK_ID, sigma=config.sigma,
        )  # fmt: skip

    if config.omega <= 0:
        return tdt()
    if config.omega >= 1:
        return full_losses(task, encoded, predicted, labels, encoder_lengths, label_lengths)
    seed = tf.stack([tf.cast(task.updates(), tf.int32), 7919])
    draw = tf.random.stateless_uniform([], seed)
    return tf.cond(
        draw < config.omega,
        lambda: full_losses(task, encoded, predicted, labels, encoder_lengths, label_lengths),
        tdt,
    )


# loss.kind -> the per-utterance transducer loss (before the auxiliary CTC loss). A new
# kind is a function here (and its heads in LossHeads), composed from asrkit.losses.
TRANSDUCER_LOSSES = {"full": full_losses, "pruned": pruned_losses, "tdt": tdt_losses}
