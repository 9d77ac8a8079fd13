"""Training curves of an experiment: read from its TensorBoard events, drawn as one PNG.

`read_curves(exp_dir)` returns the scalars asrkit's trainer logs (loss and learning rate
per update, dev WER per epoch, the running count of skipped windows); `plot_curves` draws
them with matplotlib (the `plot` extra: `pip install 'asrkit[plot]'`), skipped windows
marked on the loss curve.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from asrkit.errors import InputError

TAGS = {
    "train/loss": "loss",
    "train/learning_rate": "learning_rate",
    "train/skipped_windows": "skipped",
    "dev/wer": "dev_wer",
}


@dataclass(frozen=True)
class Curves:
    """(update, value) pairs per scalar, sorted by update; the last value wins per update."""

    loss: list[tuple[int, float]] = field(default_factory=list)
    learning_rate: list[tuple[int, float]] = field(default_factory=list)
    skipped: list[tuple[int, float]] = field(default_factory=list)  # running count
    dev_wer: list[tuple[int, float]] = field(default_factory=list)  # at each epoch's end

    @property
    def skipped_at(self) -> list[int]:
        """Updates at which a window was skipped (the running count went up)."""
        out, previous = [], 0.0
        for step, count in self.skipped:
            if count > previous:
                out.append(step)
            previous = count
        return out


def read_curves(exp_dir: str | os.PathLike) -> Curves:
    import tensorflow as tf

    events = sorted((Path(exp_dir) / "tensorboard").glob("events.*"))
    if not events:
        raise InputError(f"{exp_dir}: no TensorBoard events (tensorboard/ made by asrkit train)")
    series: dict[str, dict[int, float]] = {name: {} for name in TAGS.values()}
    for path in events:
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag in TAGS:
                    number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") \
                        else float(value.simple_value)  # fmt: skip
                    series[TAGS[value.tag]][int(event.step)] = number
    return Curves(**{name: sorted(points.items()) for name, points in series.items()})


def plot_curves(curves: Curves, out: str | os.PathLike, title: str = "") -> Path:
    """Loss and learning rate against updates, dev WER against updates at each epoch end;
    skipped windows as red marks. Writes a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError(
            "plotting needs matplotlib: pip install 'asrkit[plot]' (make demo installs it)"
        ) from None
    if not curves.loss:
        raise InputError("no training loss logged yet: nothing to plot")
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    steps, values = zip(*curves.loss, strict=True)
    top.plot(steps, values, label="training loss (epoch mean so far)")
    for step in curves.skipped_at:
        top.axvline(step, color="red", alpha=0.4, linewidth=1)
    if curves.skipped_at:
        top.plot([], [], color="red", alpha=0.4, label=f"skipped window ({len(curves.skipped_at)})")
    top.set_ylabel("loss per token")
    top.set_yscale("log")
    top.legend(loc="upper right")
    if curves.learning_rate:
        lr_axis = top.twinx()
        steps, values = zip(*curves.learning_rate, strict=True)
        lr_axis.plot(steps, values, color="gray", linestyle="--", linewidth=1)
        lr_axis.set_ylabel("learning rate (dashed)")
    if curves.dev_wer:
        steps, values = zip(*curves.dev_wer, strict=True)
        bottom.plot(steps, [100 * v for v in values], marker="o")
        for epoch, (step, value) in enumerate(curves.dev_wer, start=1):
            bottom.annotate(f"{epoch}", (step, 100 * value), textcoords="offset points",
                            xytext=(0, 6), ha="center", fontsize=7)  # fmt: skip
    bottom.set_ylabel("dev WER % (greedy, per epoch)")
    bottom.set_xlabel("optimizer updates")
    figure.suptitle(title or "training curves")
    figure.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
