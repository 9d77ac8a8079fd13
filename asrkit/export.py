"""SavedModel export: waveforms in, transcripts with timed words out, all in one graph.

Two signatures, the same graph (and each again with word boosting and n-gram LM fusion,
their tables as inputs: `serve_boosted`, `serve_batch_boosted`):
* `serving_default`: one mono float32 waveform at the model's sample rate (16 kHz by
  default), any length: one longer than a window (the longest training utterance) is
  decoded in windows, cut and joined as `asrkit transcribe` does, in bounded memory.
* `serve_batch`: padded waveforms [N, S] and their lengths [N] (samples).
Both return, per utterance, "text", "tokens" (int32, -1 past "token_counts"),
"token_times" (seconds, from the emitting encoder frame), "score" (log-probability),
the words ("words", "word_starts", "word_ends", "word_confidence", "word_counts"; see
`asrkit.decoding.words` for the definitions), the n-best list ("nbest_texts",
"nbest_scores", "nbest_counts": the beam, best first; one entry for greedy search) and
"windows" (how many windows the recording was decoded in). `serving_default` returns them
without the batch axis and without padding (tokens end at `token_counts`, the n-best at
`nbest_counts`). The signatures are the stages of `asrkit.decoding.recogniser`, the
pipeline `asrkit transcribe` and `asrkit decode` run: features (log-mel + the training
set's mean/variance), the encoder, the search and detokenisation are all TensorFlow ops,
so `tf.saved_model.load(dir)` serves it with TensorFlow alone — asrkit need not be
installed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from asrkit import __version__
from asrkit.decoding.fusion.tables import FusionTables
from asrkit.decoding.long_audio import windowing_for
from asrkit.decoding.recogniser import (
    FUSION_SPECS,
    OUTPUTS,
    WAVEFORMS_SPECS,
    Recogniser,
    with_fusion_inputs,
)
from asrkit.decoding.search.front import DecodeOptions, describe
from asrkit.decoding.search.strategies import strategy
from asrkit.decoding.words import FrameClock, detokenize
from asrkit.experiment import load_experiment, read_training_lengths

# What asrkit_export.json says of each signature.
SIGNATURES = {
    "serving_default": "waveform: mono float32 [S] in [-1, 1], any length",
    "serve_batch": "waveforms: float32 [N, S] zero-padded; lengths: int32 [N] samples; a batch "
    "with a row longer than a window: row by row, each as serving_default",
}
BOOSTED_SIGNATURES = {
    "serve_boosted": "serving_default with word boosting and/or LM fusion: waveform, and the "
    "tables (boost_start, boost_next_state, boost_bonus, boost_final) of a phrase list and/or "
    "an n-gram LM made with the export's tokenizer (asrkit.decoding.fusion.tables.combine)",
    "serve_batch_boosted": "serve_batch with the same tables",
}
STREAM_SIGNATURES = {
    "initial_state": "no inputs -> state_* of a new stream",
    "stream_step": "samples: mono float32 [n] in [-1, 1], any n; state_*: as returned",
    "stream_tokens": "stream_step without the text (no string ops: LiteRT converts it); every "
    "axis that can be empty has one padding entry in front: drop tokens[0] and token_times[0], "
    "pass state_* back as they are",
    "stream_finish": "state_* -> the end of the stream: what the last, partial chunk of a "
    "chunked Conformer emits (nothing for an LSTM encoder)",
    "finish_tokens": "stream_finish without the text",
}


def export_model(
    exp_dir: str | Path,
    out: str | Path,
    checkpoint: str | None = None,
    average: int = 1,
    options: DecodeOptions | None = None,
    chunk_frames: int | None = None,
) -> Path:
    """Writes the SavedModel of an experiment's checkpoint (or the average of its last
    `average` checkpoints) to `out`, with an `asrkit_export.json` describing it. `options`:
    the search built into the graph (default: greedy with the experiment's symbols limit).
    `chunk_frames`: another chunk size for a model trained with dynamic chunks."""
    experiment = load_experiment(exp_dir, checkpoint, average, chunk_frames)
    config, tokenizer = experiment.config, experiment.tokenizer
    options = options or config.decode  # the experiment's own search
    features = config.features
    trained = read_training_lengths(exp_dir)
    windowing, _ = windowing_for(trained.max_seconds if trained else None)
    recogniser = Recogniser.of(experiment, options, windowing)
    clock = recogniser.clock

    out = Path(out)
    archive = keras.export.ExportArchive()
    # Not `archive.track(model)`: Keras would save the model's variables twice (as tracked
    # and again as the endpoints' own), doubling the file. The endpoints' variables are
    # saved once, with them.
    waveform = tf.TensorSpec([None], tf.float32, name="waveform")
    archive.add_endpoint("serve", recogniser.one, input_signature=[waveform])
    archive.add_endpoint("serve_batch", recogniser.batch, input_signature=list(WAVEFORMS_SPECS))
    boosting = strategy(options.method, config.model).fusion  # CTC search takes none
    if boosting:
        archive.add_endpoint("serve_boosted", with_fusion_inputs(recogniser.one),
                             input_signature=[waveform, *FUSION_SPECS])  # fmt: skip
        archive.add_endpoint("serve_batch_boosted", with_fusion_inputs(recogniser.batch),
                             input_signature=[*WAVEFORMS_SPECS, *FUSION_SPECS])  # fmt: skip
    archive.write_out(str(out), verbose=False)
    # the tokenizer a client compiles phrase lists and LMs with (`transcribe --model --boost`)
    shutil.copytree(experiment.tokenizer.model_path.parent, out / "tokenizer", dirs_exist_ok=True)
    info = {
        "asrkit_version": __version__,
        "sample_rate": features.sample_rate,
        "signatures": {**SIGNATURES, **(BOOSTED_SIGNATURES if boosting else {})},
        "outputs": OUTPUTS,
        "decoding": describe(options),
        # the most hypotheses the n-best list holds (transcribe --nbest checks it)
        "hypotheses": strategy(options.method, config.model).hypotheses(options.beam),
        # token_times = max(0, frame_offset - emission_delay + frame * frame_period)
        "frame_period": clock.period,
        "frame_offset": clock.offset,
        "emission_delay": clock.delay,
        "vocab_size": tokenizer.vocab_size,
        **_provenance(exp_dir, experiment, options),
        # the longest utterance trained on: what `asrkit transcribe --model` keeps its
        # windows of long recordings within (null: not recorded)
        "training_max_seconds": trained.max_seconds if trained else None,
        # serving_default decodes a longer waveform in windows of these (bounded memory)
        "window_seconds": windowing.max_seconds,
        "window_context_seconds": windowing.context_seconds,
    }
    (out / "asrkit_export.json").write_text(json.dumps(info, indent=2) + "\n")
    return out


STREAM_OUTPUTS = {
    "tokens": "int32 [n]: the tokens this piece of audio completed",
    "token_times": "float32 [n], seconds from the stream's start",
    "text": "string: the text so far",
    "state_*": "the stream's state after this piece: pass it all back with the next piece",
}


def export_streaming(
    exp_dir: str | Path,
    out: str | Path,
    checkpoint: str | None = None,
    average: int = 1,
    chunk_frames: int | None = None,
    fusion: FusionTables | None = None,
    fusion_described: str = "",
) -> Path:
    """Writes a streaming SavedModel: `initial_state()` -> the state_* tensors of a new
    stream; `stream_step(samples, state_*...)` -> the tokens the samples completed (any
    number of samples, 0 included), their times, the text so far and the new state_*;
    `stream_finish(state_*...)` at the end of the stream. Greedy search, as `asrkit
    transcribe --streaming`; needs an encoder that streams. `chunk_frames`: another chunk
    size for a model trained with dynamic chunks. `fusion`: word boosting and/or LM tables
    built into the graph (the automata's states are one more state_* tensor), as
    `fusion_described` says."""
    from asrkit.decoding.streaming import StreamingDecoder

    experiment = load_experiment(exp_dir, checkpoint, average, chunk_frames)
    model, config, tokenizer = experiment.network, experiment.config, experiment.tokenizer
    decoder, lite_decoder = (
        StreamingDecoder(
            model, config.features, experiment.normalizer, config.decode.max_symbols_per_step,
            boost=fusion, feature_dtype=dtype,
        )  # NeMo's features in float64 up to the log; LiteRT has float32 FFTs only
        for dtype in (tf.float64, tf.float32)
    )  # fmt: skip
    clock = FrameClock.of(config.features, experiment.emission_delay, config.model.encoder)
    stream = _StreamEndpoints(decoder, lite_decoder, tokenizer.surface_pieces(), clock)
    specs = stream.specs
    out = Path(out)
    archive = keras.export.ExportArchive()
    # Not `archive.track(model)`: Keras would save the model's variables twice (as tracked
    # and again as the endpoints' own), doubling the file. The endpoints' variables are
    # saved once, with them.
    archive.add_endpoint("initial_state", stream.initial_state, input_signature=[])
    inputs = [tf.TensorSpec([None], tf.float32, name="samples"), *specs]
    archive.add_endpoint("stream_step", stream.stream_step, input_signature=inputs)
    archive.add_endpoint("stream_tokens", stream.stream_tokens, input_signature=inputs)
    archive.add_endpoint("stream_finish", stream.stream_finish, input_signature=specs)
    archive.add_endpoint("finish_tokens", stream.finish_tokens, input_signature=specs)
    archive.write_out(str(out), verbose=False)
    info = {
        "asrkit_version": __version__,
        "sample_rate": config.features.sample_rate,
        "streaming": True,
        "signatures": STREAM_SIGNATURES,
        "pieces": tokenizer.surface_pieces(),  # token id -> text ("▁" starts a word)
        "outputs": STREAM_OUTPUTS,
        "state": stream.names,
        "decoding": "greedy, streaming" + (f", {fusion_described}" if fusion else ""),
        "frame_period": clock.period,
        "frame_offset": clock.offset,
        "emission_delay": clock.delay,
        "vocab_size": tokenizer.vocab_size,
        **_provenance(exp_dir, experiment, None),
    }
    (out / "asrkit_export.json").write_text(json.dumps(info, indent=2) + "\n")
    return out


class _StreamEndpoints:
    """A streaming decoder's steps as signature functions: the state as flat state_*
    tensors, times in seconds, the text so far; the LiteRT variants (`lite_decoder`: float32
    features) without text and with a padding entry in front of every axis that can be
    empty (LiteRT's interpreter cannot return an empty tensor)."""

    def __init__(self, decoder, lite_decoder, pieces: list[str], clock: FrameClock):
        self.decoder, self.lite_decoder, self.clock = decoder, lite_decoder, clock
        self.pieces = tf.constant(pieces)
        self.template = decoder.initial_state()
        flat = tf.nest.flatten(decoder.state_spec)
        self.names = [f"state_{i:02d}" for i in range(len(flat))]
        self.specs = [tf.TensorSpec(s.shape, s.dtype, name=n)
                      for s, n in zip(flat, self.names, strict=True)]  # fmt: skip
        self.spec_of = dict(zip(self.names, self.specs, strict=True))

    def initial_state(self):
        return dict(zip(self.names, tf.nest.flatten(self.decoder.initial_state()), strict=True))

    def _run(self, samples, state, decoder):
        state = tf.nest.pack_sequence_as(self.template, list(state))
        step = decoder.step(samples, state) if samples is not None else decoder.finish(state)
        outputs = {
            "tokens": step.tokens,
            "token_times": self.clock.seconds(step.token_frames),
            **dict(zip(self.names, tf.nest.flatten(step.state), strict=True)),
        }
        return step.state.tokens, outputs

    def _lite(self, samples, state):
        state = [_drop_front(t, spec) for t, spec in zip(state, self.specs, strict=True)]
        outputs = self._run(samples, state, self.lite_decoder)[1]
        return {key: _pad_front(value, self.spec_of.get(key)) for key, value in outputs.items()}

    def stream_step(self, samples, *state):
        tokens, outputs = self._run(samples, state, self.decoder)
        text = detokenize(tokens[None], tf.shape(tokens)[0][None], self.pieces)[0]
        return {**outputs, "text": text}

    def stream_finish(self, *state):
        return self.stream_step(None, *state)

    def stream_tokens(self, samples, *state):
        return self._lite(samples, state)

    def finish_tokens(self, *state):
        return self._lite(None, state)


def _provenance(exp_dir, experiment, options: DecodeOptions | None) -> dict:
    """What decides an export's output besides its weights, for asrkit_export.json: the
    experiment and weights it came from, the encoder's chunk (null: full context), the
    search (None: the streaming decoder's greedy one) and the fusion weights `asrkit
    transcribe --model` uses with --boost/--lm/--lodr, as the experiment's decode settings
    give them."""
    config = experiment.config
    decode = config.decode
    chunk = getattr(experiment.network.encoder, "chunk_frames", None)
    search = (
        {"method": "greedy", "beam": 1, "max_symbols_per_step": decode.max_symbols_per_step}
        if options is None
        else {"method": options.method,
              "beam": strategy(options.method, config.model).hypotheses(options.beam),
              "max_symbols_per_step": options.max_symbols_per_step}
    )  # fmt: skip
    return {
        "experiment": str(Path(exp_dir).resolve()),
        "weights": experiment.weights,
        "chunk_frames": int(chunk) if chunk else None,
        "search": search,
        "fusion_weights": {
            key: getattr(decode, key) for key in ("boost_weight", "lm_weight", "lodr_weight")
        },
        # NeMo's token LMs name pieces by id (`asrkit lm` reads them so for imported models)
        "nemo_ids": config.features.lm_tokens_by_id,
    }


def convert_to_litert(saved_model: str | Path, out: str | Path) -> Path:
    """The streaming export's `stream_tokens` and `finish_tokens` signatures as a LiteRT
    (.tflite) model, built-in ops only (the text is left to the caller: `pieces` in
    asrkit_export.json), and a new stream's state beside it (`<out>.initial_state.npz`,
    padded as those signatures take it: the state is a constant)."""
    converter = tf.lite.TFLiteConverter.from_saved_model(
        str(saved_model), signature_keys=["stream_tokens", "finish_tokens"]
    )
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    out = Path(out)
    out.write_bytes(converter.convert())
    loaded = tf.saved_model.load(str(saved_model))
    initial = loaded.signatures["initial_state"]()
    specs = loaded.signatures["stream_tokens"].structured_input_signature[1]
    np.savez(
        initial_state_path(out),
        **{k: _pad_front(v, specs[k]).numpy() for k, v in initial.items()},
    )
    return out


def _pad_front(tensor, spec=None):
    """One zero entry in front along every axis `spec` leaves open (no spec: axis 0)."""
    axes = [0] if spec is None else [i for i, d in enumerate(spec.shape) if d is None]
    for axis in axes:
        paddings = [[0, 0]] * tensor.shape.rank
        paddings[axis] = [1, 0]
        tensor = tf.pad(tensor, paddings)
    return tensor


def _drop_front(tensor, spec):
    """`_pad_front` undone."""
    for axis, size in enumerate(spec.shape):
        if size is None:
            tensor = tf.gather(tensor, tf.range(1, tf.shape(tensor)[axis]), axis=axis)
    return tensor


def initial_state_path(litert_model: str | Path) -> Path:
    return Path(f"{litert_model}.initial_state.npz")
