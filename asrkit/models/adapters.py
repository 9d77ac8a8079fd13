"""Adapters on a built transducer network: which linear layers LoRA adapts, turning it (or
the blocks' linear adapters) on with everything else frozen, and merging a trained LoRA
update into plain weights.

LoRA (Hu et al., 2021) keeps a pretrained kernel W frozen and trains a low-rank update:
the layer computes x (W + (alpha / rank) A B), A [in, rank] random, B [rank, out] zeros, so
an adapted network starts as its base exactly. Keras' own `Dense.enable_lora` holds A and
B (`lora_kernel_a`, `lora_kernel_b`, float32 whatever the precision policy) and the scale;
this module chooses the layers (`model.adapters.targets`) and freezes everything else, so
that the optimizer's slots and the accumulators exist for A and B only.

Decoding never runs the adapted layers: `merged_weights` folds each A B into its kernel in
float64 (checkpoint values in, values of the plain network out), and the plain network
described by the same config (without adapters) takes them.
"""

from __future__ import annotations

import keras
import numpy as np

from asrkit.config import AdaptersConfig
from asrkit.models.conformer import ConformerEncoder

LORA_A, LORA_B = "lora_kernel_a", "lora_kernel_b"  # Keras' names, the checkpoints' too


def lora_layers(network, targets: tuple[str, ...]) -> dict[str, keras.layers.Dense]:
    """The Dense layers `targets` name in a built network, by their checkpoint prefix
    (`encoder.blocks.3.attention.qkv`)."""
    found: dict[str, keras.layers.Dense] = {}
    blocks = network.encoder.blocks if isinstance(network.encoder, ConformerEncoder) else None
    if blocks is None and set(targets) - {"joint"}:
        raise ValueError(
            f"model.adapters.targets {list(targets)}: a {type(network.encoder).__name__} has "
            "no Conformer blocks; LoRA adapts a Conformer's blocks (or only the joint: "
            "targets [joint])"
        )
    for i, block in enumerate(blocks or []):
        at = f"encoder.blocks.{i}"
        if "attention" in targets:
            found[f"{at}.attention.qkv"] = block.attention.qkv
            found[f"{at}.attention.out"] = block.attention.out
        if "feed_forward" in targets:
            for ff in ("ff1", "ff2"):
                for linear in ("inner", "outer"):
                    found[f"{at}.{ff}.{linear}"] = getattr(getattr(block, ff), linear)
        if "convolution" in targets:
            for linear in ("pointwise_in", "pointwise_out"):
                found[f"{at}.conv.{linear}"] = getattr(block.conv, linear)
    if "joint" in targets:
        joint = network.joint
        for linear in ("encoder_proj", "predictor_proj", "output_layer"):
            found[f"joint.{linear}"] = getattr(joint, linear)
    return found


def add_adapters(network, config: AdaptersConfig, keep=()) -> list[str]:
    """Readies a built network for fine-tuning through `config`'s adapters: LoRA turned on
    in its target layers, or the linear adapters its blocks already hold (`kind: linear`
    builds them with the network); every other weight frozen but the variables in `keep`
    (which train in full). Returns the adapted layers' names; a no-op for `kind: none`."""
    if config.kind == "none":
        return []
    if not network.built:
        raise ValueError("add_adapters: build the network first (Transducer.build_from_features)")
    if config.kind == "lora":
        layers = lora_layers(network, config.targets)
        trained = []
    else:
        layers = {f"encoder.blocks.{i}.adapter": block.adapter
                  for i, block in enumerate(network.encoder.blocks)}  # fmt: skip
        trained = [v for layer in layers.values() for v in layer.trainable_variables]
    kept = {id(v) for v in [*keep, *trained] if v.trainable}
    for variable in network.variables:
        variable.trainable = id(variable) in kept
    if config.kind == "lora":
        for layer in layers.values():
            layer.enable_lora(config.rank, lora_alpha=config.alpha)
    return sorted(layers)


def has_lora(values: dict[str, np.ndarray]) -> bool:
    return any(key.endswith("." + LORA_A) for key in values)


def merged_weights(values: dict[str, np.ndarray], config: AdaptersConfig) -> dict[str, np.ndarray]:
    """Checkpoint values of an adapted network -> the plain network's: each kernel plus
    (alpha / rank) A B (in float64, stored back in the kernel's dtype), A and B dropped.
    Values without LoRA pass through unchanged."""
    if not has_lora(values):
        return dict(values)
    if config.kind != "lora":
        raise ValueError(
            "these weights hold LoRA adapters but model.adapters.kind is "
            f"{config.kind!r}: the experiment's config does not say how to merge them"
        )
    scale = config.alpha / config.rank
    out = {k: v for k, v in values.items() if not k.endswith((LORA_A, LORA_B))}
    for key in values:
        if not key.endswith("." + LORA_A):
            continue
        prefix = key[: -len(LORA_A)]
        kernel = values[prefix + "kernel"]
        a = values[key].astype(np.float64)
        b = values[prefix + LORA_B].astype(np.float64)
        out[prefix + "kernel"] = (kernel.astype(np.float64) + scale * (a @ b)).astype(kernel.dtype)
    return out
