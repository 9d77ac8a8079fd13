"""Streaming recognition of a test set, side by side: greedy search on each whole file
against streaming at 320 ms and 640 ms pieces (the network, then the exported streaming
SavedModel and its LiteRT model): WER, the real-time factor of the streaming step, and the
algorithmic latency.

RTF = wall time of all steps / audio duration (features, encoder, search; after one warm-up
file). Latency: a token emitted at encoder frame t needs audio up to (640 t + 1360) samples
— the subsampling's receptive field ends 85 ms after the frame's first sample — so the
audio that completes a frame waits at most one piece before it is decoded; with a chunked
Conformer a frame also waits for the rest of its chunk.

    python tools/bench_streaming.py --exp-dir exp/mini/exp --manifest exp/mini/data/test-clean.jsonl
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import timed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exp-dir", required=True)
    parser.add_argument("--manifest", required=True, help="JSONL manifest with references")
    parser.add_argument("--utterances", type=int, default=0, help="the first N (0: all)")
    parser.add_argument("--average", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="timed passes (median RTF)")
    parser.add_argument("--chunk-frames", type=int,
                        help="dynamic-chunk model: run with this chunk size")  # fmt: skip
    args = parser.parse_args(argv)

    import tensorflow as tf

    from asrkit.audio import read_audio
    from asrkit.data.manifest import read_manifest
    from asrkit.decoding.streaming import StreamingDecoder
    from asrkit.decoding.transcribe import NetworkRecogniser
    from asrkit.experiment import load_experiment
    from asrkit.export import convert_to_litert, export_streaming, initial_state_path
    from asrkit.metrics import error_rates

    utts = read_manifest(args.manifest)
    utts = utts[: args.utterances] if args.utterances else utts
    audio = [read_audio(u.audio_path) for u in utts]
    refs = [u.text for u in utts]
    seconds = sum(len(a) for a in audio) / 16000
    experiment = load_experiment(args.exp_dir, average=args.average,
                                 chunk_frames=args.chunk_frames)  # fmt: skip
    recogniser = NetworkRecogniser.of(experiment)
    tokenizer = experiment.tokenizer
    encoder = experiment.config.model.encoder
    frames = experiment.network.encoder.chunk_frames if encoder.kind == "conformer" else 0
    chunk = frames * 0.04
    print(f"{len(audio)} utterances, {seconds:.1f} s; encoder {encoder.kind}"
          + (f", chunks of {frames} frames ({chunk * 1000:.0f} ms), "
             f"{encoder.left_chunks} back" if chunk else " (causal)"))  # fmt: skip

    whole = [h.text for h in _whole(recogniser, audio)]
    rows = [("greedy, whole file", error_rates(refs, whole).wer, None, None)]
    decoder = StreamingDecoder(recogniser.model, recogniser.features,
                               recogniser.recogniser.normalise,
                               recogniser.options.max_symbols_per_step)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        saved = export_streaming(args.exp_dir, Path(tmp) / "s", average=args.average,
                                 chunk_frames=args.chunk_frames)  # fmt: skip
        loaded = tf.saved_model.load(str(saved))
        litert = convert_to_litert(saved, Path(tmp) / "s.tflite")
        for piece in (0.32, 0.64):
            size = round(piece * 16000)
            runners = {
                "network": lambda a, size=size: _network(decoder, a, size),
                "SavedModel": lambda a, size=size: _saved(loaded, a, size),
                "LiteRT": lambda a, size=size: _litert(litert, initial_state_path(litert), a, size),
            }
            for name, run in runners.items():
                tokens = []

                def every_file(run=run, tokens=tokens):
                    tokens[:] = [run(a) for a in audio]

                run(audio[0])  # warm-up
                wall = timed(every_file, repeats=args.repeats, warmup=0)
                texts = [tokenizer.decode(t) for t in tokens]
                rows.append((f"streaming {piece * 1000:.0f} ms, {name}",
                             error_rates(refs, texts).wer, wall.median / seconds,
                             piece + 0.085 + chunk))  # fmt: skip
                assert texts == whole or chunk, "a causal encoder streams the whole file's text"
    print(f"{'':36} {'WER':>8} {'RTF':>8} {'latency (s)':>12}")
    for name, wer, rtf, latency in rows:
        print(f"{name:36} {100 * wer:7.2f}% " + (f"{rtf:8.4f} {latency:12.3f}" if rtf else ""))
    return 0


def _whole(recogniser, audio):
    out = []
    for a in audio:
        out.append(recogniser([a])[0].best)
    return out


def _network(decoder, samples, size):
    state, tokens = decoder.initial_state(), []
    for start in range(0, len(samples), size):
        step = decoder.step(samples[start : start + size], state)
        tokens += step.tokens.numpy().tolist()
        state = step.state
    return tokens + decoder.finish(state).tokens.numpy().tolist()


def _saved(loaded, samples, size):
    import tensorflow as tf

    step, finish = loaded.signatures["stream_step"], loaded.signatures["stream_finish"]
    state, tokens = loaded.signatures["initial_state"](), []
    for start in range(0, len(samples), size):
        out = step(samples=tf.constant(samples[start : start + size]), **state)
        state = {k: v for k, v in out.items() if k.startswith("state_")}
        tokens += out["tokens"].numpy().tolist()
    return tokens + finish(**state)["tokens"].numpy().tolist()


_INTERPRETERS = {}


def _litert(model, initial, samples, size):
    import warnings

    import tensorflow as tf

    if model not in _INTERPRETERS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _INTERPRETERS[model] = tf.lite.Interpreter(
                model_path=str(model),
                experimental_op_resolver_type=(
                    tf.lite.experimental.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
                ),
            )
    interpreter = _INTERPRETERS[model]
    step = interpreter.get_signature_runner("stream_tokens")
    finish = interpreter.get_signature_runner("finish_tokens")
    with np.load(initial) as first:
        state = dict(first)
    tokens = []
    for start in range(0, len(samples), size):
        out = step(samples=samples[start : start + size].astype(np.float32), **state)
        state = {k: v for k, v in out.items() if k.startswith("state_")}
        tokens += out["tokens"].tolist()[1:]  # one padding entry in front
    return tokens + finish(**state)["tokens"].tolist()[1:]


if __name__ == "__main__":
    raise SystemExit(main())
