"""NeMo state-dict tensors -> the variables of asrkit's Conformer (with NeMo's options),
LSTM predictor and joint. NeMo's names live here only.

torch lays a Linear's weight out [out, in] (Keras: kernel [in, out]), a Conv2d's
[out, in, kh, kw] (Keras: [kh, kw, in, out]), a depthwise Conv2d's [C, 1, kh, kw] (Keras:
[kh, kw, C, 1]), a depthwise Conv1d's [C, 1, k] (Keras: [k, C, 1]) and a pointwise Conv1d's
[out, in, 1], an LSTM's weight_ih/hh [4u, in] (gates i, f, g, o: Keras' i, f, c, o) with two
biases (Keras: one, their sum). NeMo's separate query, key and value projections are
asrkit's one `qkv` projection [q | k | v]; its pre-norms (`norm_feed_forward1`, `norm_conv`,
...) belong to asrkit's modules. Every tensor of the state dict must be used and every
variable filled, with its shape: anything else is an error naming the key.

Token ids: NeMo's blank is the last output (V) and its embedding row V is the zero padding
row; asrkit's blank is id 0 and its tokenizer ids are NeMo's + 1
(`asrkit.importers.nemo_tokenizer`), so the embedding rows and the joint's output rows are
rotated by one: asrkit row 0 = NeMo row V, asrkit row k + 1 = NeMo row k.
"""

from __future__ import annotations

import numpy as np

from asrkit.errors import InputError
from asrkit.models.conformer import ConformerEncoder


class WeightMismatch(InputError):
    """A NeMo tensor that is missing, left over, or of another shape than its variable."""


class _Assigner:
    def __init__(self, state: dict[str, np.ndarray], prefix: str):
        self.state, self.prefix, self.used = state, prefix, set()

    def take(self, key: str) -> np.ndarray:
        full = self.prefix + key
        if full not in self.state:
            raise WeightMismatch(f"the checkpoint has no {full}")
        self.used.add(full)
        return self.state[full]

    def put(self, variable, value: np.ndarray, key: str) -> None:
        if tuple(variable.shape) != tuple(value.shape):
            raise WeightMismatch(
                f"{self.prefix}{key}: shape {tuple(value.shape)} does not fit {variable.path} "
                f"{tuple(variable.shape)} (does the config match the weights?)"
            )
        variable.assign(value.astype(np.float32))

    def linear(self, dense, key: str) -> None:
        self.put(dense.kernel, self.take(f"{key}.weight").T, f"{key}.weight")
        if dense.use_bias:
            self.put(dense.bias, self.take(f"{key}.bias"), f"{key}.bias")

    def pointwise1d(self, dense, key: str) -> None:
        self.put(dense.kernel, self.take(f"{key}.weight")[:, :, 0].T, f"{key}.weight")
        if dense.use_bias:
            self.put(dense.bias, self.take(f"{key}.bias"), f"{key}.bias")

    def conv2d(self, conv, key: str, depthwise: bool = False) -> None:
        weight = self.take(f"{key}.weight")
        kernel = weight.transpose(2, 3, 0, 1) if depthwise else weight.transpose(2, 3, 1, 0)
        self.put(conv.kernel, kernel, f"{key}.weight")
        self.put(conv.bias, self.take(f"{key}.bias"), f"{key}.bias")

    def linears(self, dense, keys: list[str]) -> None:
        """One Dense from the concatenated outputs of several torch Linears."""
        weights = [self.take(f"{k}.weight").T for k in keys]
        self.put(dense.kernel, np.concatenate(weights, axis=1), f"{keys[0]}.weight ...")
        if dense.use_bias:
            biases = [self.take(f"{k}.bias") for k in keys]
            self.put(dense.bias, np.concatenate(biases), f"{keys[0]}.bias ...")

    def norm(self, layer, key: str) -> None:
        self.put(layer.gamma, self.take(f"{key}.weight"), f"{key}.weight")
        self.put(layer.beta, self.take(f"{key}.bias"), f"{key}.bias")

    def batch_norm(self, layer, key: str) -> None:
        self.norm(layer, key)
        self.put(layer.moving_mean, self.take(f"{key}.running_mean"), f"{key}.running_mean")
        self.put(layer.moving_variance, self.take(f"{key}.running_var"), f"{key}.running_var")
        self.used.add(f"{self.prefix}{key}.num_batches_tracked")


def assign_nemo_encoder(
    encoder: ConformerEncoder, state: dict[str, np.ndarray], prefix: str = ""
) -> set[str]:
    """Fills a built encoder (relative attention, a striding subsampling, BatchNorm or
    LayerNorm convolutions, final_norm block) from NeMo's ConformerEncoder tensors under
    `prefix` (`encoder.` in a whole model's state dict); returns the keys used."""
    a = _Assigner(state, prefix)
    sub = encoder.subsampling
    for i, conv in enumerate(sub.convs):
        # NeMo's conv sequence: conv, ReLU (striding); conv, ReLU, [dw, pw, ReLU]... (dw).
        index = 2 * i if sub.kind == "striding" else (0 if i == 0 else 3 * i - 1)
        a.conv2d(conv, f"pre_encode.conv.{index}", depthwise=sub.kind == "dw_striding" and i > 0)
        if sub.kind == "dw_striding" and i > 0:
            a.conv2d(sub.pointwise[i - 1], f"pre_encode.conv.{index + 1}")
    a.linear(sub.out, "pre_encode.out")
    for n, block in enumerate(encoder.blocks):
        layer = f"layers.{n}"
        norms = (
            (block.ff1.norm, "norm_feed_forward1"), (block.attn_norm, "norm_self_att"),
            (block.conv.pre_norm, "norm_conv"), (block.ff2.norm, "norm_feed_forward2"),
            (block.out_norm, "norm_out"),
        )  # fmt: skip
        for norm, key in norms:
            a.norm(norm, f"{layer}.{key}")
        for ff, key in ((block.ff1, "feed_forward1"), (block.ff2, "feed_forward2")):
            a.linear(ff.inner, f"{layer}.{key}.linear1")
            a.linear(ff.outer, f"{layer}.{key}.linear2")
        att, at = block.attention, f"{layer}.self_attn"
        a.linears(att.qkv, [f"{at}.linear_q", f"{at}.linear_k", f"{at}.linear_v"])
        a.linear(att.out, f"{at}.linear_out")
        a.linear(att.position, f"{at}.linear_pos")
        a.put(att.pos_bias_u, a.take(f"{at}.pos_bias_u"), "pos_bias_u")
        a.put(att.pos_bias_v, a.take(f"{at}.pos_bias_v"), "pos_bias_v")
        conv = block.conv
        a.pointwise1d(conv.pointwise_in, f"{layer}.conv.pointwise_conv1")
        depthwise = a.take(f"{layer}.conv.depthwise_conv.weight").transpose(2, 0, 1)
        a.put(conv.depthwise.kernel, depthwise, f"{layer}.conv.depthwise_conv.weight")
        if conv.use_bias:
            a.put(conv.depthwise.bias, a.take(f"{layer}.conv.depthwise_conv.bias"), "bias")
        if conv.norm_type == "layer":  # NeMo's conv_norm_type layer_norm, same name
            a.norm(conv.norm, f"{layer}.conv.batch_norm")
        else:
            a.batch_norm(conv.norm, f"{layer}.conv.batch_norm")
        a.pointwise1d(conv.pointwise_out, f"{layer}.conv.pointwise_conv2")
        if block.adapter is not None:  # NeMo's LinearAdapter: LayerNorm, Linear, swish, Linear
            a.norm(block.adapter.norm, f"{layer}.adapter.module.0")
            a.linear(block.adapter.down, f"{layer}.adapter.module.1")
            a.linear(block.adapter.up, f"{layer}.adapter.module.3")
    mine = {k for k in state if k.startswith(prefix)}
    left = sorted(mine - a.used)
    if left:
        raise WeightMismatch(
            f"{len(left)} encoder tensor(s) of the checkpoint have no place in the model, e.g. "
            f"{left[:3]} (another architecture or an option not supported?)"
        )
    return a.used


def blank_first(rows: np.ndarray, vocab_with_blank: int) -> np.ndarray:
    """NeMo's rows [blank last] -> asrkit's [blank first] along axis 0 (the first
    `vocab_with_blank` rows; a TDT joint's duration rows after them are not included)."""
    v = vocab_with_blank - 1
    return np.concatenate([rows[v : v + 1], rows[:v]], axis=0)


def assign_nemo_transducer(network, state: dict[str, np.ndarray], source: str = "") -> None:
    """Fills a built asrkit Transducer (a Conformer with NeMo's options, LSTM predictor with
    blank_as_pad, relu/tanh joint, and for a hybrid model the CTC head) from a NeMo
    EncDecRNNTBPEModel's or EncDecHybridRNNTCTCBPEModel's whole state dict (the
    preprocessor's and augmentation's buffers removed). Errors name `source` (the file)."""
    try:
        _assign_transducer(network, state)
    except WeightMismatch as err:
        raise WeightMismatch(f"{source}: {err}" if source else str(err)) from None


def _assign_transducer(network, state: dict[str, np.ndarray]) -> None:
    used = assign_nemo_encoder(network.encoder, state, "encoder.")
    a = _Assigner(state, "")
    vocab = network.vocab_size  # asrkit's V = NeMo's tokens + blank
    predictor = network.predictor
    embed = a.take("decoder.prediction.embed.weight")
    if embed.shape[0] != vocab:
        raise WeightMismatch(
            f"decoder.prediction.embed.weight: {embed.shape[0]} rows for a vocabulary of "
            f"{vocab - 1} + blank (is the tokenizer the model's own?)"
        )
    a.put(predictor.embedding.embeddings, blank_first(embed, vocab), "decoder.prediction.embed")
    for k, lstm in enumerate(predictor.lstms):
        key = "decoder.prediction.dec_rnn.lstm"
        cell = lstm.cell
        a.put(cell.kernel, a.take(f"{key}.weight_ih_l{k}").T, f"{key}.weight_ih_l{k}")
        a.put(cell.recurrent_kernel, a.take(f"{key}.weight_hh_l{k}").T, f"{key}.weight_hh_l{k}")
        if getattr(cell, "input_bias", None) is not None:  # torch's two biases, kept apart
            a.put(cell.input_bias, a.take(f"{key}.bias_ih_l{k}"), f"{key}.bias_ih_l{k}")
            a.put(cell.bias, a.take(f"{key}.bias_hh_l{k}"), f"{key}.bias_hh_l{k}")
        else:
            bias = a.take(f"{key}.bias_ih_l{k}") + a.take(f"{key}.bias_hh_l{k}")
            a.put(cell.bias, bias, f"{key}.bias_ih_l{k} + bias_hh_l{k}")
    joint = network.joint
    a.put(joint.encoder_proj.kernel, a.take("joint.enc.weight").T, "joint.enc.weight")
    if joint.predictor_bias:
        a.put(joint.encoder_proj.bias, a.take("joint.enc.bias"), "joint.enc.bias")
        a.put(joint.predictor_proj.bias, a.take("joint.pred.bias"), "joint.pred.bias")
    else:  # hidden = enc(e) + pred(p): both biases are one bias of the sum
        a.put(joint.encoder_proj.bias, a.take("joint.enc.bias") + a.take("joint.pred.bias"),
              "joint.enc.bias + joint.pred.bias")  # fmt: skip
    a.put(joint.predictor_proj.kernel, a.take("joint.pred.weight").T, "joint.pred.weight")
    out_key = next((k for k in ("joint.joint_net.2", "joint.joint_net.1")
                    if f"{k}.weight" in state), "joint.joint_net.1")  # fmt: skip
    weight, bias = a.take(f"{out_key}.weight"), a.take(f"{out_key}.bias")
    durations = joint.durations
    if weight.shape[0] != vocab + durations:
        raise WeightMismatch(
            f"{out_key}.weight: {weight.shape[0]} outputs for a vocabulary of {vocab - 1} + "
            f"blank + {durations} durations (does the config match the weights?)"
        )
    a.put(joint.output_layer.kernel, blank_first(weight[:vocab], vocab).T, f"{out_key}.weight")
    a.put(joint.output_layer.bias, blank_first(bias[:vocab], vocab), f"{out_key}.bias")
    if durations:
        a.put(joint.duration_layer.kernel, weight[vocab:].T, f"{out_key}.weight (durations)")
        a.put(joint.duration_layer.bias, bias[vocab:], f"{out_key}.bias (durations)")
    if network.ctc_head is not None:  # NeMo's ConvASRDecoder: a pointwise Conv1d
        key = "ctc_decoder.decoder_layers.0"
        weight = a.take(f"{key}.weight")
        if weight.shape[0] != vocab:
            raise WeightMismatch(
                f"{key}.weight: {weight.shape[0]} outputs for a vocabulary of {vocab - 1} + "
                "blank (is the CTC head the model's own?)"
            )
        a.put(network.ctc_head.kernel, blank_first(weight[:, :, 0], vocab).T, f"{key}.weight")
        a.put(network.ctc_head.bias, blank_first(a.take(f"{key}.bias"), vocab), f"{key}.bias")
    left = sorted(set(state) - used - a.used)
    if left:
        raise WeightMismatch(
            f"{len(left)} tensor(s) of the checkpoint have no place in the model, e.g. "
            f"{left[:3]} (another architecture or an option not supported?)"
        )


def check_feature_buffers(state: dict[str, np.ndarray], features, source: str) -> None:
    """The checkpoint's own mel filterbank and window (`preprocessor.featurizer.fb`,
    `.window`), if it has them, must be the ones asrkit computes from the settings (NeMo
    computes them the same way; a model trained with other buffers is refused)."""
    from asrkit.features import nemo_settings
    from asrkit.nemo_mel import slaney_mel_filterbank, symmetric_hann

    settings = nemo_settings(features)
    expected = {
        "preprocessor.featurizer.fb": slaney_mel_filterbank(settings),
        "preprocessor.featurizer.window": symmetric_hann(settings.win_length),
    }
    for key, want in expected.items():
        if key not in state:
            continue
        got = np.asarray(state[key], np.float64)
        if got.size != want.size or (
            np.max(np.abs(got.reshape(want.shape) - want)) > 1e-6 * max(1.0, np.max(np.abs(want)))
        ):
            raise WeightMismatch(
                f"{source}: {key} differs from the buffer of the preprocessor settings (a "
                "filterbank or window asrkit does not compute)"
            )
