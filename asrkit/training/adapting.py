"""A network made ready for fine-tuning through adapters: built, LoRA or the linear
adapters turned on, and what `train.trainable` names left to train in full (checked
against the network's weights); and which of its weights its checkpoints take from the
base instead of holding them."""

from __future__ import annotations

from asrkit.checkpoints import named_variables
from asrkit.config import ConfigError, ExperimentConfig
from asrkit.models.adapters import add_adapters


def named_weights(network, entries: tuple[str, ...]) -> list:
    """The variables `entries` name: checkpoint names (`joint.output_layer.kernel`) or
    prefixes of them ending at a dot (`joint.output_layer`, `predictor`). An entry that
    names nothing is an error listing the network's parts."""
    named = named_variables(network)
    found = []
    for entry in entries:
        stem = entry.rstrip(".")
        hits = [v for n, v in named.items() if n == stem or n.startswith(stem + ".")]
        if not hits:
            parts = sorted({".".join(n.split(".")[:2]) for n in named if ".blocks." not in n})
            raise ConfigError(
                f"train.trainable: {entry!r} names no weight of this network; name weights as "
                f"its checkpoints do, e.g. {parts}"
            )
        found += hits
    return found


def apply_adapters(network, config: ExperimentConfig) -> list[str]:
    """`model.adapters` (LoRA or linear adapters) on a network, built here if needed,
    `train.trainable` kept trainable; returns the adapted layers' names ([] without)."""
    adapters = config.model.adapters
    if adapters.kind == "none":
        return []
    network.build_from_features(config.features.num_mel_bins)
    return add_adapters(network, adapters, named_weights(network, config.train.trainable))


def from_base(network, loaded) -> list[str]:
    """The weights an adapted run's checkpoints leave to its base: those loaded from it
    (`loaded`, names) that are frozen floating-point parameters. BatchNorm's moving
    statistics move without being trainable (`conv_norm: batch`), so they are kept."""
    loaded = set(loaded)
    return [
        name for name, v in named_variables(network).items()
        if name in loaded and not v.trainable and "float" in str(v.dtype)
        and not name.endswith(("moving_mean", "moving_variance"))
    ]  # fmt: skip
