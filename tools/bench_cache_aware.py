"""NeMo's cache-aware streaming model, streamed by asrkit and by NeMo side by side: for each
look-ahead, the time of one streaming step (one chunk of audio in, its tokens out; median
and 90th percentile), the real-time factor of the steps, the tokens both find, and the
memory of one stream's state.

    python tools/bench_cache_aware.py --nemo model.nemo --nemo-python /path/nemo-venv/bin/python \
        --clips a.flac b.flac --repeats 3

Both sides get the audio in NeMo's chunks (the first of 1 + 8R feature frames, then
8 (R + 1), R the look-ahead). asrkit: the exported streaming SavedModel's `stream_step`
and its LiteRT model, each step from raw samples (features included). NeMo: its example
loop (`CacheAwareStreamingAudioBuffer` + `conformer_stream_step`, torch on the same cores),
each step from features the buffer computed for the whole file beforehand (NeMo's
streaming takes whole files), so NeMo's steps leave out the features asrkit's include.
The repeats alternate (NeMo, asrkit, NeMo, ...) per look-ahead, min-max over them, after
one warm-up clip on each side. The model's blank is
favoured first (`--blank-bias`, added to the joint's blank output in a copy of the archive
both sides read), so that an untrained model of a published shape emits at a trained
model's pace, not at every frame. The state's memory: asrkit's state tensors after the
longest clip (steady state: the attention caches full); NeMo's three cache tensors.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

NEMO_SIDE = r"""
import json, sys, time
import numpy as np, soundfile, torch
from nemo.collections.asr.models import ASRModel
from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer

torch.set_num_threads(2)
job = json.loads(sys.argv[1])
model = ASRModel.restore_from(job["nemo"], map_location="cpu")
model.eval()
if job.get("save"):
    with torch.no_grad():
        out = model.joint.joint_net[-1]
        out.bias[model.tokenizer.vocab_size] += job["blank_bias"]  # NeMo's blank: last
    model.save_to(job["save"])
    print("{}")
    sys.exit(0)
result = {}
for right in job["lookaheads"]:
    contexts = [c for c in model.encoder.att_context_size_all if c[1] == right]
    model.encoder.set_default_att_context_size(contexts[0])
    steps, tokens, caches = [], [], 0
    for number, clip in enumerate([job["clips"][0]] + job["clips"]):  # the first: warm-up
        if number == 1:
            steps, tokens = [], []
        wave = soundfile.read(clip, dtype="float32")[0]
        buffer = CacheAwareStreamingAudioBuffer(model=model)
        buffer.append_audio(wave)
        c_channel, c_time, c_len = model.encoder.get_initial_cache_state(batch_size=1)
        caches = max(caches, 4 * (c_channel.numel() + c_time.numel()) + 8 * c_len.numel())
        previous = None
        for step, (chunk, lengths) in enumerate(iter(buffer)):
            drop = 0 if step == 0 else model.encoder.streaming_cfg.drop_extra_pre_encoded
            start = time.perf_counter()
            with torch.inference_mode():
                (_, _, c_channel, c_time, c_len, previous) = model.conformer_stream_step(
                    processed_signal=chunk, processed_signal_length=lengths,
                    cache_last_channel=c_channel, cache_last_time=c_time,
                    cache_last_channel_len=c_len, keep_all_outputs=buffer.is_buffer_empty(),
                    previous_hypotheses=previous, drop_extra_pre_encoded=drop,
                    return_transcription=True)
            steps.append(time.perf_counter() - start)
        tokens.append([int(t) for t in previous[0].y_sequence])
    result[str(right)] = {"steps": steps, "tokens": tokens, "state_bytes": caches}
print(json.dumps(result))
"""


def _nemo(python: str, job: dict) -> dict:
    run = subprocess.run([python, "-c", NEMO_SIDE, json.dumps(job)], capture_output=True,
                         text=True, timeout=7200)  # fmt: skip
    if run.returncode != 0:
        sys.exit(f"bench_cache_aware.py: NeMo's side failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1]) if run.stdout.strip() else {}


def _run(command) -> None:
    made = subprocess.run([str(c) for c in command], capture_output=True, text=True)
    if made.returncode != 0:
        sys.exit(f"bench_cache_aware.py: {command[1]} failed:\n{made.stderr[-3000:]}")


def _pieces(samples: int, right: int, hop: int = 160) -> list[tuple[int, int]]:
    """NeMo's chunks in samples: 1 + 8R feature frames, then 8 (R + 1) each."""
    first, shift = (1 + 8 * right) * hop, 8 * (right + 1) * hop
    bounds = [0, min(first, samples)]
    while bounds[-1] < samples:
        bounds.append(min(bounds[-1] + shift, samples))
    return list(itertools.pairwise(bounds))


def _saved(loaded, wave, right):
    import tensorflow as tf

    step, finish = loaded.signatures["stream_step"], loaded.signatures["stream_finish"]
    state, tokens, times = loaded.signatures["initial_state"](), [], []
    for start, stop in _pieces(len(wave), right):
        began = time.perf_counter()
        out = step(samples=tf.constant(wave[start:stop]), **state)
        state = {k: v for k, v in out.items() if k.startswith("state_")}
        tokens += out["tokens"].numpy().tolist()
        times.append(time.perf_counter() - began)
    began = time.perf_counter()
    out = finish(**state)
    times[-1] += time.perf_counter() - began  # the last chunk's step ends the stream
    state_bytes = sum(v.numpy().nbytes for k, v in out.items() if k.startswith("state_"))
    return tokens + out["tokens"].numpy().tolist(), times, state_bytes


def _interpreter(path):
    import warnings

    import tensorflow as tf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tf.lite.Interpreter(
            model_path=str(path), num_threads=2,
            experimental_op_resolver_type=(
                tf.lite.experimental.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
            ),
        )  # fmt: skip


def _litert(interpreter, path, wave, right):
    step = interpreter.get_signature_runner("stream_tokens")
    finish = interpreter.get_signature_runner("finish_tokens")
    with np.load(f"{path}.initial_state.npz") as initial:
        state = dict(initial)
    tokens, times = [], []
    for start, stop in _pieces(len(wave), right):
        began = time.perf_counter()
        out = step(samples=wave[start:stop], **state)
        state = {k: v for k, v in out.items() if k.startswith("state_")}
        tokens += out["tokens"].tolist()[1:]
        times.append(time.perf_counter() - began)
    began = time.perf_counter()
    out = finish(**state)
    times[-1] += time.perf_counter() - began
    return tokens + out["tokens"].tolist()[1:], times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nemo", required=True, help="a cache-aware streaming .nemo")
    parser.add_argument("--nemo-python", required=True, help="the Python of a NeMo venv")
    parser.add_argument("--clips", nargs="+", required=True, help="16 kHz audio files")
    parser.add_argument("--lookaheads", type=int, nargs="*", help="default: the model's")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--blank-bias", type=float, default=6.0)
    args = parser.parse_args(argv)

    import tensorflow as tf

    from asrkit.audio import read_audio
    from asrkit.experiment import load_experiment_config

    tf.config.threading.set_intra_op_parallelism_threads(2)
    clips = [str(Path(c).resolve()) for c in args.clips]
    waves = [read_audio(c, 16000) for c in clips]
    seconds = sum(len(w) for w in waves) / 16000
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        nemo = str(tmp / "favoured.nemo")
        _nemo(args.nemo_python, {"nemo": str(Path(args.nemo).resolve()), "save": nemo,
                                 "blank_bias": args.blank_bias})  # fmt: skip
        asrkit = Path(sys.executable).parent / "asrkit"
        _run([asrkit, "import", "nemo", nemo, "--exp-dir", tmp / "exp"])
        encoder = load_experiment_config(tmp / "exp").model.encoder
        lookaheads = args.lookaheads or list(encoder.lookaheads or [encoder.chunk_frames - 1])
        for right in lookaheads:  # each in its own process: a 114 M export holds GBs
            _run([asrkit, "export", "--exp-dir", tmp / "exp", "--out", tmp / f"s{right}",
                  "--streaming", "--litert", "--lookahead-frames", str(right)])  # fmt: skip
        figures = {r: {"nemo": [], "saved": [], "litert": []} for r in lookaheads}
        same, state_bytes, nemo_state = {}, {}, {}
        for right in lookaheads:  # one export in memory at a time
            loaded = tf.saved_model.load(str(tmp / f"s{right}"))
            litert = _interpreter(tmp / f"s{right}" / "stream_tokens.tflite")
            _saved(loaded, waves[0], right)  # warm-up
            _litert(litert, tmp / f"s{right}" / "stream_tokens.tflite", waves[0], right)
            job = {"nemo": nemo, "clips": clips, "lookaheads": [right]}
            for repeat in range(args.repeats):
                theirs = _nemo(args.nemo_python, job)[str(right)]
                figures[right]["nemo"].append(theirs["steps"])
                nemo_state[right] = theirs["state_bytes"]
                saved_steps, lite_steps, agree = [], [], True
                for wave, want in zip(waves, theirs["tokens"], strict=True):
                    tokens, times, held = _saved(loaded, wave, right)
                    state_bytes[right] = max(state_bytes.get(right, 0), held)
                    saved_steps += times
                    lite_tokens, times = _litert(
                        litert, tmp / f"s{right}" / "stream_tokens.tflite", wave, right
                    )
                    lite_steps += times
                    agree &= [t - 1 for t in tokens] == want == [t - 1 for t in lite_tokens]
                figures[right]["saved"].append(saved_steps)
                figures[right]["litert"].append(lite_steps)
                same[right] = same.get(right, True) and agree
                print(f"look-ahead {right}: repeat {repeat + 1}/{args.repeats} done",
                      file=sys.stderr, flush=True)  # fmt: skip
            del loaded, litert
    print(f"{len(waves)} clips, {seconds:.1f} s of audio; {args.repeats} repeats (min-max); "
          f"2 CPU cores")  # fmt: skip
    print(f"{'look-ahead':>10} {'chunk':>7} {'streamer':>16} {'step median ms':>16} "
          f"{'step p90 ms':>13} {'RTF':>15} {'state KiB':>10} {'tokens = NeMo':>14}")  # fmt: skip
    for right in lookaheads:
        for name, label in (("nemo", "NeMo (torch)"), ("saved", "asrkit SavedModel"),
                            ("litert", "asrkit LiteRT")):  # fmt: skip
            runs = figures[right][name]
            medians = [1000 * float(np.median(r)) for r in runs]
            p90 = [1000 * float(np.percentile(r, 90)) for r in runs]
            rtf = [sum(r) / seconds for r in runs]
            memory = nemo_state[right] if name == "nemo" else state_bytes[right]
            print(f"{right:>10} {80 * (right + 1):>5}ms {label:>16} "
                  f"{min(medians):7.1f}-{max(medians):<7.1f} {min(p90):6.1f}-{max(p90):<6.1f} "
                  f"{min(rtf):.4f}-{max(rtf):.4f} {memory / 1024:10.0f} "
                  f"{'yes' if name == 'nemo' or same[right] else 'NO':>14}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
