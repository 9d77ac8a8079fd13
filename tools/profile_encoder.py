"""Where an encoder's forward pass spends its time, asrkit beside NeMo, kernel by kernel.

One NeMo Conformer-Transducer (`--nemo-model`, e.g. make_nemo_published.py's 114 M), imported
into asrkit with `asrkit import nemo`; each side encodes random features of `--shapes`
(utterances x seconds) in a fresh process under its profiler (TensorFlow's, from the trace it
writes; PyTorch's), after a warm-up, `--rounds` calls. Printed per shape and precision: the
wall time per call of each side, then each side's kernels by kind (matrix products,
convolutions, elementwise, norms, softmax, casts and copies, layout) and its largest
kernels, in ms per call. asrkit runs as its
commands run (oneDNN on); `--precision bfloat16` also runs asrkit's bfloat16 encoder
(`--precision bfloat16` of decode and transcribe) and NeMo under PyTorch's CPU autocast.

    python tools/profile_encoder.py --nemo-python /path/nemo-venv/bin/python \\
        --nemo-model fc_114m.nemo [--shapes 1x3.5,16x3.5] [--precision float32 bfloat16]

The profilers' own cost is in the figures (a few %); the wall times beside them are
measured without a profiler.
"""

from __future__ import annotations

import argparse
import collections
import glob
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import AS_COMMANDS_RUN, child_request, reply, run_child  # noqa: E402

# kernel kinds, by the op's name on each side (first match)
KINDS = (
    ("matrix products", r"MatMul|Einsum|addmm|^aten::mm$|bmm|matmul|linear"),
    ("convolutions", r"Conv|convolution"),
    ("norms", r"layer_norm|batch_norm|LayerNorm|FusedBatchNorm"),
    ("softmax", r"[Ss]oftmax"),
    ("casts and copies", r"Cast|copy|_to_copy|clone|contiguous"),
    ("layout", r"Transpose|transpose|Pad|Slice|Split|Pack|Concat|Gather|Reshape|pad|cat|index"),
)
ROUNDS = 5


def _kind(name: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, name)), "elementwise")


def _asrkit(request: dict) -> dict:
    import numpy as np
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from asrkit.experiment import load_experiment

    experiment = load_experiment(request["exp"], precision=request["precision"])
    network, mels = experiment.network, experiment.config.features.num_mel_bins
    batch, frames = request["batch"], request["frames"]
    features = tf.random.normal([batch, frames, mels])
    lengths = tf.fill([batch], frames)
    spec = [tf.TensorSpec([None, None, mels]), tf.TensorSpec([None], tf.int32)]
    encode = tf.function(lambda f, n: network.encode(f, n)[0], input_signature=spec,
                         autograph=False)  # fmt: skip
    for _ in range(2):
        encode(features, lengths).numpy()
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        encode(features, lengths).numpy()
        times.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        for _ in range(ROUNDS):
            encode(features, lengths).numpy()
        tf.profiler.experimental.stop()
        (path,) = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
        space = xplane_pb2.XSpace()
        space.ParseFromString(Path(path).read_bytes())
    kernels = collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if "/" not in name or ":" not in name:
                    continue  # not a TensorFlow op
                kernels[name.rsplit(":", 1)[1]] += event.duration_ps / 1e9 / ROUNDS
    return {"wall ms": float(np.median(times)) * 1000, "kernels": dict(kernels)}


def _nemo(request: dict) -> dict:
    import logging

    logging.disable(logging.WARNING)
    import numpy as np
    import torch
    from nemo.collections.asr.models import EncDecRNNTBPEModel

    model = EncDecRNNTBPEModel.restore_from(request["nemo_model"], map_location="cpu").eval()
    batch, frames = request["batch"], request["frames"]
    features = torch.randn(batch, model.cfg.preprocessor.features, frames)
    lengths = torch.full([batch], frames)
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if request["precision"] == "bfloat16"
                else torch.autocast("cpu", enabled=False))  # fmt: skip
    with torch.inference_mode(), autocast:
        for _ in range(2):
            model.encoder(audio_signal=features, length=lengths)
        times = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            model.encoder(audio_signal=features, length=lengths)
            times.append(time.perf_counter() - start)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(ROUNDS):
                model.encoder(audio_signal=features, length=lengths)
    kernels = {event.key: event.self_cpu_time_total / 1000 / ROUNDS
               for event in prof.key_averages() if event.self_cpu_time_total > 0}  # fmt: skip
    return {"wall ms": float(np.median(times)) * 1000, "kernels": kernels}


def _by_kind(kernels: dict) -> collections.Counter:
    kinds = collections.Counter()
    for name, ms in kernels.items():
        kinds[_kind(name)] += ms
    return kinds


def _print(title: str, sides: dict) -> None:
    print(f"{title}:")
    walls = {side: figures["wall ms"] for side, figures in sides.items()}
    print("  wall per call (no profiler): " + " | ".join(f"{s} {ms:.1f} ms"
                                                          for s, ms in walls.items()))  # fmt: skip
    kinds = {side: _by_kind(figures["kernels"]) for side, figures in sides.items()}
    print("  kernels by kind, ms per call: " + " | ".join(sides))
    for kind in [k for k, _ in KINDS] + ["elementwise"]:
        print(f"    {kind:20s} " + " | ".join(f"{kinds[s][kind]:8.1f}" for s in sides))
    for side, figures in sides.items():
        top = collections.Counter(figures["kernels"]).most_common(8)
        print(f"  {side}'s largest: " + ", ".join(f"{k} {ms:.1f}" for k, ms in top))


def _refuse(message: str) -> None:
    print(f"profile_encoder.py: {message}", file=sys.stderr)
    sys.exit(2)


def _shape(text: str) -> tuple[int, float]:
    try:
        batch, seconds = text.lower().split("x")
        return int(batch), float(seconds)
    except ValueError:
        _refuse(f"--shapes: {text!r} is not UTTERANCESxSECONDS (e.g. 16x3.5)")


def main() -> None:
    request = child_request()
    if request is not None:
        reply(_nemo(request) if request["side"] == "nemo" else _asrkit(request))
        return
    from bench_vs_nemo import _imported, _run_nemo, add_nemo_arguments, check_nemo_arguments

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_nemo_arguments(parser)
    parser.add_argument("--shapes", default="1x3.5,16x3.5",
                        help="UTTERANCESxSECONDS[,...] of random features")  # fmt: skip
    parser.add_argument("--precision", nargs="+", default=["float32", "bfloat16"],
                        choices=["float32", "bfloat16"])  # fmt: skip
    args = parser.parse_args()
    check_nemo_arguments(args, _refuse)
    shapes = [_shape(text) for text in args.shapes.split(",")]

    with tempfile.TemporaryDirectory() as scratch:
        exp = _imported(args.nemo_model, Path(scratch) / "exp")
        for batch, seconds in shapes:
            for precision in args.precision:
                request = {"exp": exp, "nemo_model": str(Path(args.nemo_model).resolve()),
                           "batch": batch, "frames": int(seconds * 100),
                           "precision": precision}  # fmt: skip
                sides = {
                    "asrkit": run_child(__file__, {**request, "side": "asrkit"},
                                        env=AS_COMMANDS_RUN),
                    "nemo": _run_nemo(args.nemo_python, {**request, "side": "nemo"},
                                      script=__file__),
                }  # fmt: skip
                _print(f"{batch} x {seconds:g} s, {precision}", sides)


if __name__ == "__main__":
    main()
