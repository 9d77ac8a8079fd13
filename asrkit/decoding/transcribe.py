"""Transcribing audio files: text, timed words and n-best lists, long files in windows.

A recogniser turns waveforms into `Decoded` windows. Two kinds, one result:
`NetworkRecogniser` runs a loaded experiment's network here; `SavedModelRecogniser` runs an
`asrkit export` through its `serve_batch` signature (TensorFlow only). `transcribe_files`
cuts long files (`asrkit.decoding.long_audio`), batches the windows by padded duration,
and joins each file's windows back by time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import tensorflow as tf

from asrkit.audio import AudioError, read_audio
from asrkit.config import ExperimentConfig
from asrkit.data.manifest import Utterance, read_utterance
from asrkit.decoding.beam import beam_found
from asrkit.decoding.long_audio import Window, Windowing, join_words, plan_windows
from asrkit.decoding.runner import by_budget, featurise_samples
from asrkit.decoding.search import DEFAULT_OPTIONS, Hypothesis, decode_nbest, found_hypotheses
from asrkit.decoding.strategies import strategy
from asrkit.decoding.words import Alignment, FrameClock, Word, align, row_words
from asrkit.errors import InputError
from asrkit.features import normalizer_for
from asrkit.tokenizer import Tokenizer

EXPORT_INFO = "asrkit_export.json"


@dataclass(frozen=True)
class Decoded:
    """One waveform's result: the best hypothesis, its timed words, the n-best list."""

    best: Hypothesis
    alignment: Alignment
    nbest: list[Hypothesis]


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
    """A loaded network with its tokenizer, feature settings and statistics."""

    def __init__(
        self,
        model,
        tokenizer: Tokenizer,
        config: ExperimentConfig,
        options=DEFAULT_OPTIONS,
        emission_delay: float = 0.0,
        boost=None,
    ):
        self.model, self.tokenizer, self.options = model, tokenizer, options
        self.boost = boost  # fusion tables (`asrkit.decoding.fusion`) or None
        self.features = config.features
        self.sample_rate = config.features.sample_rate
        self.clock = FrameClock.of(config.features, emission_delay, config.model.encoder)
        self.normalize = normalizer_for(config.data.cmvn)
        self.pieces = tokenizer.surface_pieces()
        self._streaming = None  # made on first use (streaming_decoder)

    @classmethod
    def of(cls, experiment, options=DEFAULT_OPTIONS, boost=None) -> NetworkRecogniser:
        """A loaded `asrkit.experiment.Experiment`, with its emission delay."""
        return cls(
            experiment.network, experiment.tokenizer, experiment.config, options,
            experiment.emission_delay, boost,
        )  # fmt: skip

    def streaming_decoder(self):
        """The recogniser's search as a `StreamingDecoder`: one per recogniser, so that
        its compiled step serves every file streamed (a 17-block Conformer's step took
        ~8 s to trace)."""
        if self._streaming is None:
            from asrkit.decoding.streaming import StreamingDecoder

            self._streaming = StreamingDecoder(
                self.model, self.features, self.normalize, self.options.max_symbols_per_step,
                strategy(self.options.method, self.model.config).hypotheses(self.options.beam),
                self.boost,
            )  # fmt: skip
        return self._streaming

    def __call__(self, waveforms: list[np.ndarray]) -> list[Decoded]:
        batch = featurise_samples(waveforms, self.features, self.normalize)
        found = decode_nbest(
            self.model, batch.features, batch.feature_lengths, self.tokenizer, self.options,
            self.boost,
        )  # fmt: skip
        alignments = align([hyps[0] for hyps in found], self.pieces, self.clock)
        return [
            Decoded(hyps[0], alignment, hyps)
            for hyps, alignment in zip(found, alignments, strict=True)
        ]


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
        lengths = np.array([len(w) for w in waveforms], np.int32)
        padded = np.zeros((len(waveforms), max(lengths.max(), 1)), np.float32)
        for row, samples in enumerate(waveforms):
            padded[row, : lengths[row]] = samples
        out = self.serve(waveforms=tf.constant(padded), lengths=tf.constant(lengths),
                         **self.boost)  # fmt: skip
        out = {key: value.numpy() for key, value in out.items()}
        decoded = []
        for row in range(len(waveforms)):
            n = int(out["token_counts"][row])
            if "token_frames" in out:
                frames = out["token_frames"][row, :n]
            else:  # an export from before token_frames (and emission delays)
                times = out["token_times"][row, :n]
                frames = np.rint((times - self.clock.offset) / self.clock.period).astype(int)
            words = row_words(out, row)
            best = Hypothesis(
                out["tokens"][row, :n].tolist(),
                frames.tolist(),
                float(out["score"][row]),
                out["text"][row].decode(),
            )  # per-token log-probs are not exported (word confidences are)
            nbest = [
                Hypothesis([], [], float(score), text.decode())
                for text, score in zip(
                    out["nbest_texts"][row, : out["nbest_counts"][row]],
                    out["nbest_scores"][row, : out["nbest_counts"][row]],
                    strict=True,
                )
            ]
            alignment = Alignment(words, out["token_words"][row, :n].tolist())
            decoded.append(Decoded(best, alignment, nbest))
        return decoded


def transcribe_files(
    recognise,
    paths: list,
    batch_seconds: float = 60.0,
    windowing: Windowing | None = None,
    unreadable: list[AudioError] | None = None,
) -> list[Transcript]:
    """Each audio file's transcript, in the order given; files longer than
    `windowing.max_seconds` are decoded in overlapping windows and joined by time.
    Windows are decoded in batches of at most `batch_seconds` padded audio. An item may be
    a manifest `Utterance` instead of a path (its segment, if it has one; its transcript
    is named by its id). With `unreadable` (a list), a file that cannot be read is left
    out and its error appended there; without it, the error is raised."""
    windowing = windowing or Windowing()
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
    step = round(recognise.clock.period * rate)  # windows start on encoder frames
    windows_of = {p: plan_windows(audio[p], rate, windowing, step) for p in paths}
    jobs = [(p, w) for p in paths for w in windows_of[p]]
    found: dict[tuple[str, int], Decoded] = {}
    for group in by_budget(jobs, [(w.end - w.start) / rate for _, w in jobs], batch_seconds):
        results = recognise([audio[p][w.start : w.end] for p, w in group])
        found.update(zip(((p, w.start) for p, w in group), results, strict=True))
    out = []
    for path in paths:
        windows = windows_of[path]
        decoded = [found[(path, w.start)] for w in windows]
        duration = len(audio[path]) / rate
        if len(windows) == 1:
            one = decoded[0]
            out.append(Transcript(path, one.best, one.alignment.words, one.nbest, duration))
            continue
        words = join_words(windows, [d.alignment.words for d in decoded], rate)
        joined = _join_hypotheses(windows, decoded, recognise.clock, rate)
        text = " ".join(w.text for w in words)
        out.append(Transcript(path, replace(joined, text=text), words, [], duration, len(windows)))
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


def _join_hypotheses(
    windows: list[Window], decoded: list[Decoded], clock: FrameClock, rate: int
) -> Hypothesis:
    """The tokens of the words each window keeps, with frames counted from the file's start."""
    tokens, frames, log_probs, score = [], [], [], 0.0
    for window, found in zip(windows, decoded, strict=True):
        shift = window.start / rate
        kept = {
            i
            for i, word in enumerate(found.alignment.words)
            if window.keep_from <= word.start + shift < window.keep_to
        }
        offset = round(shift / clock.period)  # exact: windows start on encoder frames
        hyp = found.best
        per_token = hyp.token_log_probs or [0.0] * len(hyp.tokens)
        for token, frame, log_prob, word in zip(
            hyp.tokens, hyp.frames, per_token, found.alignment.token_words, strict=True
        ):
            if word in kept:
                tokens.append(token)
                frames.append(frame + offset)
                log_probs.append(log_prob)
        score += hyp.score
    return Hypothesis(tokens, frames, score, "", log_probs)
