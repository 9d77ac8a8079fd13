"""The recogniser: waveforms to transcripts in TensorFlow ops, the one pipeline that
`asrkit transcribe --exp-dir`, `asrkit decode` and an export's signatures all run.

featurise (log-mel, the training set's statistics, padding) -> encode -> search (the
strategy table's row for the options) -> text and timed words (`asrkit.decoding.words`)
-> long recordings cut into windows and joined back (`asrkit.decoding.windows_graph`).
The stages are graph functions of one `Recogniser`: `find` and `find_waveforms` stop at the
search's hypotheses (what `decode` scores); `whole`, `one` and `batch` give the outputs an
export's signatures return (`OUTPUTS`), a recording longer than a window decoded window by
window, one in memory at a time.
"""

from __future__ import annotations

import tensorflow as tf

from asrkit.config import FeatureConfig
from asrkit.decoding.fusion.tables import FusionTables
from asrkit.decoding.long_audio import Windowing
from asrkit.decoding.search.beam import live_slots
from asrkit.decoding.search.found import Found
from asrkit.decoding.search.front import DEFAULT_OPTIONS, DecodeOptions, search
from asrkit.decoding.windows_graph import graph_windows
from asrkit.decoding.words import FrameClock, detokenize, timed_words
from asrkit.features import MIN_FEATURE_FRAMES, log_mel_batch

OUTPUTS = {
    "text": "string",
    "tokens": "int32 [M] (serve_batch: -1 past token_counts)",
    "token_counts": "int32",
    "token_times": "float32 [M], seconds (the emitting frame's, less the emission delay)",
    "token_frames": "int32 [M], the encoder frame that emitted each token (-1 past counts)",
    "score": "float32, log-probability of the best hypothesis",
    "words": "string [W] ('' past word_counts)",
    "word_starts": "float32 [W], seconds",
    "word_ends": "float32 [W], seconds",
    "word_confidence": "float32 [W], the lowest posterior of the word's tokens",
    "word_counts": "int32",
    "token_words": "int32 [M], the word each token belongs to (-1: none)",
    "nbest_texts": "string [K], best first (serve_batch: '' past nbest_counts)",
    "nbest_scores": "float32 [K], log-probabilities",
    "nbest_counts": "int32",
    "windows": "int32, the windows the recording was decoded in (1: whole)",
}

# Each output, with what fills a row past its count in a batch (its dtype is the
# output's); the scalars have one value per row.
PADDING = {
    "text": "", "tokens": -1, "token_counts": 0, "token_times": 0.0, "token_frames": -1,
    "score": 0.0, "words": "", "word_starts": 0.0, "word_ends": 0.0, "word_confidence": 0.0,
    "word_counts": 0, "token_words": -1, "nbest_texts": "", "nbest_scores": 0.0,
    "nbest_counts": 0, "windows": 0,
}  # fmt: skip
SCALAR_OUTPUTS = ("text", "token_counts", "score", "word_counts", "nbest_counts", "windows")

# The fusion tables (`asrkit.decoding.fusion.tables`) as inputs: a phrase list and/or an n-gram LM
# compiled with the model's tokenizer.
FUSION_SPECS = (
    tf.TensorSpec([None], tf.int32, name="boost_start"),
    tf.TensorSpec([None, None], tf.int32, name="boost_next_state"),
    tf.TensorSpec([None, None], tf.float32, name="boost_bonus"),
    tf.TensorSpec([None], tf.float32, name="boost_final"),
)
WAVEFORMS_SPECS = (
    tf.TensorSpec([None, None], tf.float32, name="waveforms"),
    tf.TensorSpec([None], tf.int32, name="lengths"),
)


def with_fusion_inputs(stage):
    """`stage(*inputs, fusion)` as a function of its inputs and then the four fusion tables
    (`FUSION_SPECS`), for a signature that takes them as tensors."""

    def fused(*inputs):
        *audio, start, next_state, bonus, final = inputs
        return stage(*audio, FusionTables(start, next_state, bonus, final))

    return fused


class Recogniser:
    """A network with what turns audio into its inputs and its hypotheses into text."""

    def __init__(
        self,
        network,
        pieces: list[str],
        features: FeatureConfig,
        normalizer=None,
        clock: FrameClock | None = None,
        windowing: Windowing | None = None,
        options: DecodeOptions = DEFAULT_OPTIONS,
    ):
        """`normalizer`: the training set's statistics (a `GlobalNormalizer`) or None;
        `clock`: default asrkit's (`FrameClock.of(features)`); `windowing`: default
        `Windowing()`."""
        self.network, self.features = network, features
        self.clock = clock or FrameClock.of(features)
        self.windowing, self.options = windowing or Windowing(), options
        self.pieces = tf.constant(pieces)
        self.statistics = None  # (mean, std) of the training set's features, if normalised
        if normalizer is not None:
            self.statistics = (tf.constant(normalizer.mean, tf.float32),
                               tf.constant(normalizer.std, tf.float32))  # fmt: skip
        self.rate = features.sample_rate
        self.step = round(self.clock.period * self.rate)  # samples per encoder frame
        # recordings up to this many samples are decoded whole, longer ones in windows
        self.window_samples = int(self.windowing.max_seconds * self.rate)
        # What `decode` calls eagerly, compiled once each (with and without fusion
        # tables): encode -> search from features, and featurise -> encode -> search. The
        # graph stages below inline the same steps (`_find`): a nested function is
        # optimised apart and rounds differently in the last bits.
        features_specs = (
            tf.TensorSpec([None, None, features.num_mel_bins], tf.float32, name="features"),
            tf.TensorSpec([None], tf.int32, name="frames"),
        )
        self._compiled = {}
        for specs, step in ((features_specs, self._search), (WAVEFORMS_SPECS, self._find)):
            self._compiled[step.__name__, False] = tf.function(
                lambda *inputs, step=step: step(*inputs, None),
                input_signature=specs, autograph=False,
            )  # fmt: skip
            self._compiled[step.__name__, True] = tf.function(
                with_fusion_inputs(step), input_signature=(*specs, *FUSION_SPECS),
                autograph=False,
            )  # fmt: skip

    @classmethod
    def of(
        cls, experiment, options: DecodeOptions = DEFAULT_OPTIONS,
        windowing: Windowing | None = None,
    ) -> Recogniser:  # fmt: skip
        """A loaded `asrkit.experiment.Experiment`, with its emission delay (`windowing`:
        default `Windowing()`)."""
        return cls.of_network(
            experiment.network, experiment.tokenizer, experiment.config, experiment.normalizer,
            options, windowing, experiment.emission_delay,
        )  # fmt: skip

    @classmethod
    def of_network(
        cls, network, tokenizer, config, normalizer, options: DecodeOptions,
        windowing: Windowing | None = None, emission_delay: float = 0.0,
    ) -> Recogniser:  # fmt: skip
        """A network with its tokenizer, `ExperimentConfig` and statistics."""
        clock = FrameClock.of(config.features, emission_delay, config.model.encoder)
        return cls(
            network, tokenizer.surface_pieces(), config.features, normalizer, clock, windowing,
            options,
        )  # fmt: skip

    def featurise(self, waveforms, lengths):
        """Padded waveforms [N, S] of `lengths` samples -> normalised features [N, T, F]
        (zero past each row's frames, at least MIN_FEATURE_FRAMES) and frames [N]."""
        lengths = tf.cast(lengths, tf.int32)
        feats, frames = log_mel_batch(waveforms, lengths, self.features)
        feats = self.normalise(feats)
        short = tf.maximum(MIN_FEATURE_FRAMES - tf.shape(feats)[1], 0)
        feats = tf.pad(feats, [[0, 0], [0, short], [0, 0]])
        mask = tf.range(tf.shape(feats)[1])[None, :] < frames[:, None]
        return tf.where(mask[:, :, None], feats, 0.0), frames

    def normalise(self, features):
        """Log-mel features [..., F] -> normalised by the training set's statistics (as
        they are without statistics)."""
        if self.statistics is None:
            return features
        mean, std = self.statistics
        return (features - mean) / std

    def find(self, features, frames, fusion: FusionTables | None = None) -> Found:
        """Normalised features [N, T, F] (zero past each row's frames) and frames [N] ->
        the search's hypotheses (compiled once: call it eagerly)."""
        compiled = self._compiled["_search", fusion is not None]
        return compiled(tf.convert_to_tensor(features, tf.float32),
                        tf.convert_to_tensor(frames, tf.int32), *(fusion or ()))  # fmt: skip

    def find_waveforms(self, waveforms, lengths, fusion: FusionTables | None = None) -> Found:
        """Padded waveforms [N, S], lengths [N] -> the search's hypotheses, each row whole
        (compiled once: call it eagerly)."""
        compiled = self._compiled["_find", fusion is not None]
        return compiled(tf.convert_to_tensor(waveforms, tf.float32),
                        tf.cast(lengths, tf.int32), *(fusion or ()))  # fmt: skip

    def _search(self, features, frames, fusion) -> Found:
        encoded, lengths = self.network.encode(features, frames, training=False)
        return search(self.network, encoded, lengths, self.options, fusion)

    def _find(self, waveforms, lengths, fusion) -> Found:
        return self._search(*self.featurise(waveforms, lengths), fusion)

    def outputs(self, tokens, token_frames, log_probs, counts, scores, nbest, windows):
        """The outputs (`OUTPUTS`) of the best hypotheses [N, M] and the n-best lists."""
        nbest_texts, nbest_scores, nbest_counts = nbest
        return {
            "text": detokenize(tokens, counts, self.pieces),
            "tokens": tokens,
            "token_counts": counts,
            "token_times": tf.where(tokens >= 0, self.clock.seconds(token_frames), 0.0),
            "token_frames": tf.where(tokens >= 0, token_frames, -1),
            "score": scores,
            **timed_words(tokens, token_frames, log_probs, counts, self.pieces, self.clock),
            "nbest_texts": nbest_texts,
            "nbest_scores": nbest_scores,
            "nbest_counts": nbest_counts,
            "windows": windows,
        }

    def whole(self, waveforms, lengths, fusion=None) -> dict:
        """Every row decoded whole: the outputs, padded."""
        found = self._find(waveforms, tf.cast(lengths, tf.int32), fusion)
        alive = live_slots(found.scores)
        nbest = (
            tf.where(alive, detokenize(found.tokens, found.counts, self.pieces), ""),
            tf.where(alive, found.scores, 0.0),
            tf.reduce_sum(tf.cast(alive, tf.int32), axis=1),
        )
        windows = tf.ones_like(found.counts[:, 0])
        return self.outputs(*[x[:, 0] for x in found], nbest, windows)

    def windowed(self, waveform, fusion=None) -> dict:
        """One recording [S] longer than a window: cut at quiet points, each window decoded
        alone (one in memory at a time), the words each window keeps (those starting inside
        its segment, timed within the window) and their tokens joined; the n-best list holds
        the joined best only."""
        starts, ends, keep_from, keep_to = graph_windows(
            waveform, self.rate, self.windowing, self.step
        )

        def window(i, tokens, frames, log_probs, score, words):
            found = self._find(
                waveform[starts[i] : ends[i]][None], (ends[i] - starts[i])[None], fusion
            )
            best = [x[:, 0] for x in found]  # tokens, frames, log-probs [1, M], count, score
            timed = {key: value[0] for key, value in
                     timed_words(*best[:4], self.pieces, self.clock).items()}  # fmt: skip
            count, word_count = best[3][0], timed["word_counts"]
            shift = tf.cast(starts[i], tf.float32) / self.rate
            word_starts = timed["word_starts"][:word_count] + shift
            kept_words = (word_starts >= keep_from[i]) & (word_starts < keep_to[i])
            owner = timed["token_words"][:count]
            kept = (owner >= 0) & tf.gather(kept_words, tf.maximum(owner, 0))
            # a kept token's word: its place among the words kept so far
            rank = tf.cumsum(tf.cast(kept_words, tf.int32)) - 1 + tf.shape(words[0])[0]

            def kept_of(values):
                return tf.boolean_mask(values[0, :count], kept)

            def kept_word(values, shifted=None):
                values = values[:word_count]
                return tf.boolean_mask(values if shifted is None else values + shifted,
                                       kept_words)  # fmt: skip

            return (
                i + 1,
                tf.concat([tokens, kept_of(best[0])], 0),
                tf.concat([frames, kept_of(best[1]) + starts[i] // self.step], 0),
                tf.concat([log_probs, kept_of(best[2])], 0),
                score + best[4][0],
                (
                    tf.concat([words[0], kept_word(timed["words"])], 0),
                    tf.concat([words[1], kept_word(timed["word_starts"], shift)], 0),
                    tf.concat([words[2], kept_word(timed["word_ends"], shift)], 0),
                    tf.concat([words[3], kept_word(timed["word_confidence"])], 0),
                    tf.concat(
                        [words[4], tf.boolean_mask(tf.gather(rank, tf.maximum(owner, 0)), kept)], 0
                    ),
                ),
            )

        empty = [tf.zeros([0], tf.int32), tf.zeros([0], tf.int32), tf.zeros([0], tf.float32)]
        no_words = (tf.zeros([0], tf.string), *[tf.zeros([0], tf.float32)] * 3,
                    tf.zeros([0], tf.int32))  # fmt: skip
        _, tokens, frames, log_probs, score, words = tf.while_loop(
            lambda i, *_: i < tf.shape(starts)[0], window,
            (tf.constant(0), *empty, tf.constant(0.0), no_words),
            shape_invariants=(tf.TensorShape([]), *[tf.TensorShape([None])] * 3,
                              tf.TensorShape([]), (tf.TensorShape([None]),) * 5),
            parallel_iterations=1,  # one window in memory at a time (the default runs 10)
        )  # fmt: skip
        counts = tf.shape(tokens)[:1]
        text = detokenize(tokens[None], counts, self.pieces)
        nbest = (text[:, None], score[None, None], tf.ones([1], tf.int32))
        out = self.outputs(tokens[None], frames[None], log_probs[None], counts, score[None],
                           nbest, tf.shape(starts)[:1])  # fmt: skip
        keys = ("words", "word_starts", "word_ends", "word_confidence", "token_words")
        joined = {key: value[None] for key, value in zip(keys, words, strict=True)}
        return {**out, **joined, "word_counts": tf.shape(words[0])[:1]}

    def one(self, waveform, fusion=None) -> dict:
        """One recording [S] of any length: the outputs without the batch axis or padding
        (tokens end at token_counts, the n-best at nbest_counts)."""
        length = tf.shape(waveform)[0]
        result = tf.cond(
            length <= self.window_samples,
            lambda: self.whole(waveform[None], length[None], fusion),
            lambda: self.windowed(waveform, fusion),
        )
        one = {key: value[0] for key, value in result.items()}
        # the words already end at their count (their width is this row's)
        for key in ("tokens", "token_times", "token_frames", "token_words"):
            one[key] = one[key][: one["token_counts"]]
        for key in ("nbest_texts", "nbest_scores"):
            one[key] = one[key][: one["nbest_counts"]]
        return one

    def rows(self, waveforms, lengths, fusion=None) -> dict:
        """Each row as `one` decodes it, one row in memory at a time, padded as `whole`
        pads its outputs."""
        count = tf.shape(waveforms)[0]
        arrays = {
            key: tf.TensorArray(tf.constant(fill).dtype, size=count, infer_shape=False)
            for key, fill in PADDING.items()
        }

        def row(i, arrays):
            one = self.one(waveforms[i, : lengths[i]], fusion)
            return i + 1, {key: arrays[key].write(i, one[key]) for key in arrays}

        _, arrays = tf.while_loop(
            lambda i, _: i < count, row, (tf.constant(0), arrays), parallel_iterations=1
        )
        padded = {}
        for key, fill in PADDING.items():
            if key in SCALAR_OUTPUTS:
                padded[key] = arrays[key].stack()
            else:
                widths = tf.map_fn(lambda i, a=arrays[key]: tf.shape(a.read(i))[0],
                                   tf.range(count), fn_output_signature=tf.int32)  # fmt: skip
                ragged = tf.RaggedTensor.from_row_lengths(arrays[key].concat(), widths)
                padded[key] = ragged.to_tensor(default_value=fill)
        return padded

    def batch(self, waveforms, lengths, fusion=None) -> dict:
        """Padded waveforms [N, S], lengths [N] -> the outputs, padded. Rows within a
        window are decoded together; a batch with a longer row row by row, each as `one`
        decodes it (bounded memory, the same result per row)."""
        lengths = tf.cast(lengths, tf.int32)
        longest = tf.reduce_max(tf.concat([lengths, [0]], 0))
        return tf.cond(
            longest <= self.window_samples,
            lambda: self.whole(waveforms, lengths, fusion),
            lambda: self.rows(waveforms, lengths, fusion),
        )
