"""NeMo state-dict tensors -> the variables of asrkit's NeMo-architecture layers.

torch lays a Linear's weight out [out, in] (Keras: kernel [in, out]), a Conv2d's
[out, in, kh, kw] (Keras: [kh, kw, in, out]), a depthwise Conv2d's [C, 1, kh, kw] (Keras:
[kh, kw, C, 1]), a depthwise Conv1d's [C, 1, k] (Keras: [k, C, 1]) and a pointwise Conv1d's
[out, in, 1]. Every tensor of the state dict must be used and every variable filled, with
its shape: anything else is an error naming the key.
"""

from __future__ import annotations

import numpy as np

from asrkit.errors import InputError
from asrkit.models.nemo_conformer import NemoConformerEncoder


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

    def linear(self, dense, key: str, bias: bool = True) -> None:
        self.put(dense.kernel, self.take(f"{key}.weight").T, f"{key}.weight")
        if bias:
            self.put(dense.bias, self.take(f"{key}.bias"), f"{key}.bias")

    def pointwise1d(self, dense, key: str) -> None:
        self.put(dense.kernel, self.take(f"{key}.weight")[:, :, 0].T, f"{key}.weight")
        self.put(dense.bias, self.take(f"{key}.bias"), f"{key}.bias")

    def conv2d(self, conv, key: str, depthwise: bool = False) -> None:
        weight = self.take(f"{key}.weight")
        kernel = weight.transpose(2, 3, 0, 1) if depthwise else weight.transpose(2, 3, 1, 0)
        self.put(conv.kernel, kernel, f"{key}.weight")
        self.put(conv.bias, self.take(f"{key}.bias"), f"{key}.bias")

    def norm(self, layer, key: str) -> None:
        self.put(layer.gamma, self.take(f"{key}.weight"), f"{key}.weight")
        self.put(layer.beta, self.take(f"{key}.bias"), f"{key}.bias")

    def batch_norm(self, layer, key: str) -> None:
        self.norm(layer, key)
        self.put(layer.moving_mean, self.take(f"{key}.running_mean"), f"{key}.running_mean")
        self.put(layer.moving_variance, self.take(f"{key}.running_var"), f"{key}.running_var")
        self.used.add(f"{self.prefix}{key}.num_batches_tracked")


def assign_nemo_encoder(
    encoder: NemoConformerEncoder, state: dict[str, np.ndarray], prefix: str = ""
) -> set[str]:
    """Fills a built encoder from NeMo's ConformerEncoder tensors under `prefix`
    (`encoder.` in a whole model's state dict); returns the keys used."""
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
            (block.norm_ff1, "norm_feed_forward1"), (block.norm_attention, "norm_self_att"),
            (block.norm_conv, "norm_conv"), (block.norm_ff2, "norm_feed_forward2"),
            (block.norm_out, "norm_out"),
        )  # fmt: skip
        for norm, key in norms:
            a.norm(norm, f"{layer}.{key}")
        for ff, key in ((block.ff1, "feed_forward1"), (block.ff2, "feed_forward2")):
            a.linear(ff.inner, f"{layer}.{key}.linear1")
            a.linear(ff.outer, f"{layer}.{key}.linear2")
        att = block.attention
        for dense, key in ((att.query, "linear_q"), (att.key, "linear_k"),
                           (att.value, "linear_v"), (att.out, "linear_out")):  # fmt: skip
            a.linear(dense, f"{layer}.self_attn.{key}")
        a.linear(att.position, f"{layer}.self_attn.linear_pos", bias=False)
        a.put(att.pos_bias_u, a.take(f"{layer}.self_attn.pos_bias_u"), "pos_bias_u")
        a.put(att.pos_bias_v, a.take(f"{layer}.self_attn.pos_bias_v"), "pos_bias_v")
        conv = block.conv
        a.pointwise1d(conv.pointwise_in, f"{layer}.conv.pointwise_conv1")
        depthwise = a.take(f"{layer}.conv.depthwise_conv.weight").transpose(2, 0, 1)
        a.put(conv.depthwise.kernel, depthwise, f"{layer}.conv.depthwise_conv.weight")
        a.put(conv.depthwise.bias, a.take(f"{layer}.conv.depthwise_conv.bias"), "bias")
        a.batch_norm(conv.norm, f"{layer}.conv.batch_norm")
        a.pointwise1d(conv.pointwise_out, f"{layer}.conv.pointwise_conv2")
    mine = {k for k in state if k.startswith(prefix)}
    left = sorted(mine - a.used)
    if left:
        raise WeightMismatch(
            f"{len(left)} encoder tensor(s) of the checkpoint have no place in the model, e.g. "
            f"{left[:3]} (another architecture or an option not supported?)"
        )
    return a.used
