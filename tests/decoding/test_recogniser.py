"""The recogniser's stages: one feature batch equal to each utterance alone; a long
recording's windows, cut and joined in the graph, equal to the NumPy oracle's."""

from pathlib import Path

import numpy as np
import pytest
import soundfile
import tensorflow as tf

from asrkit.config import FeatureConfig
from asrkit.decoding.long_audio import Windowing
from asrkit.decoding.recogniser import WAVEFORMS_SPECS, Recogniser
from asrkit.decoding.runner import padded_waveforms
from asrkit.decoding.search.front import DecodeOptions
from asrkit.decoding.transcribe import decoded_rows
from asrkit.features import GlobalNormalizer, log_mel
from tests.decoding.window_oracle import transcribe_in_windows


@pytest.mark.parametrize("kind", ["asrkit", "nemo"])
def test_a_feature_batch_holds_each_utterance_alone(kind):
    """One compiled call for a padded batch of waveforms of different lengths (one shorter
    than a frame): each row is that waveform's features computed alone, normalised, and
    zero past its own frames."""
    config = FeatureConfig(kind=kind, num_mel_bins=80) if kind == "nemo" else FeatureConfig()
    rng = np.random.default_rng(0)
    audio = [rng.uniform(-0.5, 0.5, n).astype(np.float32) for n in (16_000, 300, 7_777, 12_345)]
    normalizer = GlobalNormalizer(
        rng.normal(size=config.num_mel_bins), np.full(config.num_mel_bins, 2.0)
    )
    featurise = tf.function(Recogniser(None, [], config, normalizer).featurise,
                            input_signature=WAVEFORMS_SPECS, autograph=False)  # fmt: skip
    features, lengths = (x.numpy() for x in featurise(*padded_waveforms(audio)))
    assert features.shape[0] == len(audio)
    for row, samples in enumerate(audio):
        alone = np.asarray(normalizer(log_mel(samples, config)))
        n = int(lengths[row])
        assert n == len(alone)
        np.testing.assert_allclose(features[row, :n], alone, rtol=1e-5, atol=1e-5)
        assert not features[row, n:].any()


REAL = Path(__file__).parents[1] / "data" / "realspeech" / "test-real" / "9002" / "90021"
PIECES = ["", " ", " ", " a", " ", " ", "b", " ", " "]  # mostly bare boundaries: words of none


class WindowAlone:
    """A recogniser of `asrkit.decoding.transcribe` that decodes each waveform whole
    through `Recogniser.whole` (what the oracle decodes its windows with)."""

    def __init__(self, recogniser: Recogniser):
        self.recogniser = recogniser
        self.sample_rate, self.clock = recogniser.rate, recogniser.clock

    def __call__(self, waveforms):
        out = self.recogniser.whole(*padded_waveforms(waveforms))
        return decoded_rows({key: value.numpy() for key, value in out.items()}, self.clock)


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_a_long_recording_is_cut_and_joined_as_the_oracle_does(model, method):
    """A real clip three times over, longer than a window: `Recogniser.one` (the graph's
    cuts, one window at a time, the words each window keeps) gives the tokens, frames,
    words (timed within their window) and score of the NumPy oracle's windows decoded
    alone and joined in Python."""
    clip, rate = soundfile.read(REAL / "9002-90021-0001.flac", dtype="float32")
    samples = np.tile(clip, 3)
    duration = len(clip) / rate
    windowing = Windowing(max_seconds=1.3 * duration, context_seconds=0.5,
                          search_seconds=0.6 * duration)  # fmt: skip
    options = DecodeOptions(method, beam=3, max_symbols_per_step=2)
    recogniser = Recogniser(model, PIECES, FeatureConfig(), None, None, windowing, options)
    got = tf.function(
        recogniser.one, input_signature=[tf.TensorSpec([None], tf.float32)], autograph=False
    )(tf.constant(samples))
    got = {key: value.numpy() for key, value in got.items()}
    want = transcribe_in_windows(WindowAlone(recogniser), samples, windowing)
    assert int(got["windows"]) == want.windows == 3
    assert len(want.words) > 5
    assert got["tokens"].tolist() == want.hypothesis.tokens
    assert got["token_frames"].tolist() == want.hypothesis.frames
    assert [w.decode() for w in got["words"]] == [w.text for w in want.words]
    for key, field in (("word_starts", "start"), ("word_ends", "end"),
                       ("word_confidence", "confidence")):  # fmt: skip
        np.testing.assert_allclose(got[key], [getattr(w, field) for w in want.words], atol=1e-5)
    # each kept token points at its word in the joined list, in order (a window's tokens
    # in no word, such as a closing bare boundary, are not kept)
    owners = got["token_words"][got["token_words"] >= 0]
    assert list(owners) == sorted(owners) and set(owners) == set(range(len(want.words)))
    assert float(got["score"]) == pytest.approx(want.hypothesis.score, rel=1e-5)
    assert got["nbest_texts"].tolist() == [got["text"]]  # the joined best only
