"""Transcribing audio files: text, timed words and n-best lists, long files in windows.

A recogniser turns waveforms into `Decoded` results. Two kinds, one pipeline:
`NetworkRecogniser` runs a loaded experiment's network through
`asrkit.decoding.recogniser` here; `SavedModelRecogniser` runs an `asrkit export` (the
same stages, saved) through its `serve_batch` signature (TensorFlow only). Both decode a
recording longer than a window in windows, cut and joined in the graph.
`transcribe_files` batches the files by padded duration, a long one alone.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from asrkit.audio import AudioError, read_audio
from asrkit.data.manifest import Utterance, read_utterance
from asrkit.decoding.long_audio import Windowing
from asrkit.decoding.recogniser import (
    FUSION_SPECS,
    WAVEFORMS_SPECS,
    Recogniser,
    with_fusion_inputs,
)
from asrkit.decoding.runner import by_budget, padded_waveforms
from asrkit.decoding.search.beam import beam_found
from asrkit.decoding.search.front import DEFAULT_OPTIONS, Hypothesis, found_hypotheses
from asrkit.decoding.search.strategies import strategy
from asrkit.decoding.words import Alignment, FrameClock, Word, align, row_words
from asrkit.errors import InputError
from asrkit.tokenizer import Tokenizer

EXPORT_INFO = "asrkit_export.json"


@dataclass(frozen=True)
class Decoded:
    """One recording's result: the best hypothesis, its timed words, the n-best list
    (a recording decoded in windows: its joined best only)."""

    best: Hypothesis
    alignment: Alignment
    nbest: list[Hypothesis]
    windows: int = 1


@dataclass(frozen=True)
class Transcript:
    """One audio file's result. A file decoded in one piece (`windows == 1`) has its
    n-best list; a longer one the hypothesis joined from its windows (token frames count
    from the start of the file, the score is the windows' sum) and no n-best."""

    path: str
    hypothesis: Hypothesis
    words: list[Word]
    nbest: list[Hypothesis]
    duration: float  # seconds
    windows: int = 1

    @property
    def text(self) -> str:
        return self.hypothesis.text


class NetworkRecogniser:
    """A loaded network's `Recogniser`, with its tokenizer and fusion tables."""

    def __init__(self, recogniser: Recogniser, tokenizer: Tokenizer, boost=None):
        """`boost`: fusion tables (`asrkit.decoding.fusion.tables`) or None."""
        self.recogniser, self.tokenizer, self.boost = recogniser, tokenizer, boost
        self.model, self.options = recogniser.network, recogniser.options
        self.features, self.clock = recogniser.features, recogniser.clock
        self.sample_rate, self.window_samples = recogniser.rate, recogniser.window_samples
        self.pieces = tokenizer.surface_pieces()
        self._streaming = None  # made on first use (streaming_decoder)
        # The recogniser's stages compiled as `transcribe_files` calls them: a batch of
        # recordings decoded whole, and one recording in windows (each traced on first
        # use; the export's `serve_batch` holds both behind a condition and traces both).
        fused = boost is not None
        tables = FUSION_SPECS if fused else ()

        def with_tables(stage):
            return with_fusion_inputs(stage) if fused else stage

        self._whole = tf.function(
            with_tables(recogniser.whole),
            input_signature=(*WAVEFORMS_SPECS, *tables),
            autograph=False,
        )
        self._windowed = tf.function(
            with_tables(recogniser.windowed),
            input_signature=(tf.TensorSpec([None], tf.float32), *tables),
            autograph=False,
        )

    @classmethod
    def of(
        cls, experiment, options=DEFAULT_OPTIONS, boost=None, windowing: Windowing | None = None
    ) -> NetworkRecogniser:
        """A loaded `asrkit.experiment.Experiment`, with its emission delay; recordings
        longer than `windowing.max_seconds` (default `Windowing()`) in windows."""
        recogniser = Recogniser.of(experiment, options, windowing)
        return cls(recogniser, experiment.tokenizer, boost)

    def streaming_decoder(self):
        """The recogniser's search as a `StreamingDecoder`: one per recogniser, so that
        its compiled step serves every file streamed (a 17-block Conformer's step took
        ~8 s to trace)."""
        if self._streaming is None:
            from asrkit.decoding.streaming import StreamingDecoder

            normalize = self.recogniser.normalise
            self._streaming = StreamingDecoder(
                self.model, self.features, normalize, self.options.max_symbols_per_step,
                strategy(self.options.method, self.model.config).hypotheses(self.options.beam),
                self.boost,
            )  # fmt: skip
        return self._streaming

    def __call__(self, waveforms: list[np.ndarray]) -> list[Decoded]:
        """Waveforms within the window decoded together; a longer one alone, in windows
        (as the export's signatures decode them)."""
        tables = () if self.boost is None else tuple(self.boost)
        if max(len(w) for w in waveforms) <= self.window_samples:
            return _decoded(self._whole(*padded_waveforms(waveforms), *tables), self.clock)
        found = []
        for samples in waveforms:
            if len(samples) <= self.window_samples:
                out = self._whole(*padded_waveforms([samples]), *tables)
            else:
                out = self._windowed(np.asarray(samples, np.float32), *tables)
            found += _decoded(out, self.clock)
        return found


def _decoded(out: dict, clock: FrameClock) -> list[Decoded]:
    return decoded_rows({key: value.numpy() for key, value in out.items()}, clock)


def decoded_rows(out: dict, clock: FrameClock) -> list[Decoded]:
    """The rows of the recogniser's batched outputs (NumPy arrays; an export's too) as
    `Decoded` results."""
    decoded = []
    for row in range(len(out["token_counts"])):
        n = int(out["token_counts"][row])
        if "token_frames" in out:
            frames = out["token_frames"][row, :n]
        else:  # an export from before token_frames (and emission delays)
            times = out["token_times"][row, :n]
            frames = np.rint((times - clock.offset) / clock.period).astype(int)
        words = row_words(out, row)
        best = Hypothesis(
            out["tokens"][row, :n].tolist(),
            frames.tolist(),
            float(out["score"][row]),
            out["text"][row].decode(),
        )  # per-token log-probs are not among the outputs (word confidences are)
        windows = int(out["windows"][row]) if "windows" in out else 1
        nbest = [
            Hypothesis([], [], float(score), text.decode())
            for text, score in zip(
                out["nbest_texts"][row, : out["nbest_counts"][row]],
                out["nbest_scores"][row, : out["nbest_counts"][row]],
                strict=True,
            )
        ]
        alignment = Alignment(words, out["token_words"][row, :n].tolist())
        decoded.append(Decoded(best, alignment, nbest, windows))
    return decoded


class SavedModelRecogniser:
    """An exported SavedModel, through its batched signature."""

    def __init__(self, directory: str | Path, boost=None):
        """`boost`: fusion tables (word boosting, LM) made with the export's tokenizer
        (`tokenizer/`)."""
        directory = Path(directory)
        info_file = directory / EXPORT_INFO
        if not info_file.is_file():
            raise InputError(f"{directory} is not an asrkit export (no {EXPORT_INFO})")
        info = json.loads(info_file.read_text())
        if "serve_batch" not in info.get("signatures", {}):
            raise InputError(
                f"{directory} was exported by asrkit {info.get('asrkit_version', '?')}, "
                "without the batched signature; export it again with this version"
            )
        self.sample_rate = int(info["sample_rate"])
        # recordings longer than this are decoded in windows inside the export
        self.window_samples = int(info.get("window_seconds", Windowing.max_seconds) *
                                  self.sample_rate)  # fmt: skip
        self.clock = FrameClock(
            info["frame_period"], info["frame_offset"], info.get("emission_delay", 0.0)
        )
        signatures = tf.saved_model.load(str(directory)).signatures
        boosted = signatures.get("serve_batch_boosted")
        if boost is not None and (
            boosted is None or "boost_start" not in boosted.structured_input_signature[1]
        ):
            raise InputError(
                f"{directory} was exported without word boosting and LM fusion (CTC search, "
                "or an older asrkit); export it with greedy or beam search and this version "
                "to use --boost or --lm"
            )
        self.serve = signatures["serve_batch"] if boost is None else boosted
        self.boost = {} if boost is None else {
            "boost_start": tf.constant(boost.start),
            "boost_next_state": tf.constant(boost.next_state),
            "boost_bonus": tf.constant(boost.bonus), "boost_final": tf.constant(boost.final),
        }  # fmt: skip

    def __call__(self, waveforms: list[np.ndarray]) -> list[Decoded]:
        padded, lengths = padded_waveforms(waveforms)
        out = self.serve(waveforms=tf.constant(padded), lengths=tf.constant(lengths),
                         **self.boost)  # fmt: skip
        return _decoded(out, self.clock)


def transcribe_files(
    recognise,
    paths: list,
    batch_seconds: float = 60.0,
    unreadable: list[AudioError] | None = None,
) -> list[Transcript]:
    """Each audio file's transcript, in the order given; a file longer than the
    recogniser's window is decoded in overlapping windows joined by time (inside the
    recogniser, alone). The others are decoded in batches of at most `batch_seconds` padded
    audio. An item may be a manifest `Utterance` instead of a path (its segment, if it has
    one; its transcript is named by its id). With `unreadable` (a list), a file that cannot
    be read is left out and its error appended there; without it, the error is raised."""
    rate = recognise.sample_rate
    audio = {}
    for item in paths:
        try:
            if isinstance(item, Utterance):
                audio[item.id] = read_utterance(item, rate)
            else:
                audio[str(item)] = read_audio(str(item), rate)
        except AudioError as err:
            if unreadable is None:
                raise
            unreadable.append(err)
    paths = list(audio)
    whole = [p for p in paths if len(audio[p]) <= recognise.window_samples]
    groups = [[p] for p in paths if len(audio[p]) > recognise.window_samples]
    groups += by_budget(whole, [len(audio[p]) / rate for p in whole], batch_seconds)
    found: dict[str, Decoded] = {}
    for group in groups:
        found.update(zip(group, recognise([audio[p] for p in group]), strict=True))
    out = []
    for path in paths:
        one = found[path]
        nbest = one.nbest if one.windows == 1 else []
        out.append(Transcript(path, one.best, one.alignment.words, nbest,
                              len(audio[path]) / rate, one.windows))  # fmt: skip
    return out


def stream_file(
    recogniser: NetworkRecogniser,
    path: str | Path,
    chunk_seconds: float = 0.32,
    realtime: bool = False,
    on_partial=None,
) -> Transcript:
    """A file decoded as a stream: `chunk_seconds` of audio at a time through
    `StreamingDecoder` (the recogniser's search, greedy or beam; any length, no windows),
    calling `on_partial(seconds of audio consumed, text so far)` whenever the text changes;
    `realtime` waits for each chunk as a microphone would. The result equals the same
    search on the whole file."""
    decoder = recogniser.streaming_decoder()
    rate = recogniser.sample_rate
    samples = read_audio(str(path), rate)
    chunk = max(1, round(chunk_seconds * rate))
    shown, started = "", time.monotonic()

    def show(step, consumed: int) -> None:
        nonlocal shown
        if on_partial is not None and len(step.tokens):
            text = recogniser.tokenizer.decode(step.state.tokens.numpy().tolist())
            if text != shown:
                on_partial(consumed / rate, text)
                shown = text

    state = decoder.initial_state()
    for start in range(0, len(samples), chunk):
        end = min(start + chunk, len(samples))
        if realtime:
            time.sleep(max(0.0, started + (start + chunk) / rate - time.monotonic()))
        step = decoder.step(samples[start:end], state)
        show(step, end)
        state = step.state
    step = decoder.finish(state)  # the last, partial chunk of a chunked Conformer
    show(step, len(samples))
    state = step.state
    tokens = state.tokens.numpy().tolist()
    hypothesis = Hypothesis(
        tokens, state.token_frames.numpy().tolist(), float(state.score),
        recogniser.tokenizer.decode(tokens), state.token_log_probs.numpy().tolist(),
    )  # fmt: skip
    nbest = [hypothesis]
    if decoder.beam > 1:  # the beam's live hypotheses, best first
        (nbest,) = found_hypotheses(beam_found(state.carry), recogniser.tokenizer)
    (alignment,) = align([hypothesis], recogniser.pieces, recogniser.clock)
    return Transcript(str(path), hypothesis, alignment.words, nbest, len(samples) / rate)
