"""Long recordings: cuts fall in pauses, and windows joined by time neither lose nor repeat
a word — checked with a recogniser whose every answer is known (tone bursts), then with a
real clip concatenated with itself."""

from pathlib import Path

import numpy as np
import pytest
import soundfile

from asrkit.config import FeatureConfig
from asrkit.decoding.long_audio import Windowing, windowing_for
from asrkit.decoding.search.front import Hypothesis
from asrkit.decoding.transcribe import Decoded, transcribe_files
from asrkit.decoding.words import Alignment, FrameClock, Word
from tests.decoding.window_oracle import cut_points, plan_windows, transcribe_in_windows

RATE = 16_000
LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5)  # a burst's amplitude names its word


def bursts(seed, count=30):
    """A recording of tone bursts (0.15-0.6 s) separated by pauses (0.05-0.7 s) with a
    faint noise floor; returns the samples and each burst's (onset seconds, level index)."""
    rng = np.random.default_rng(seed)
    pieces, truth, position = [], [], 0
    for _ in range(count):
        pause = int(rng.uniform(0.05, 0.7) * RATE)
        length = int(rng.uniform(0.15, 0.6) * RATE)
        level = int(rng.integers(len(LEVELS)))
        tone = LEVELS[level] * np.sin(2 * np.pi * 440 * np.arange(length) / RATE)
        pieces += [np.zeros(pause), tone]
        truth.append((round((position + pause) / RATE, 4), level))
        position += pause + length
    pieces.append(np.zeros(int(0.3 * RATE)))
    samples = np.concatenate(pieces).astype(np.float32)
    samples += 1e-4 * rng.standard_normal(samples.size).astype(np.float32)
    return samples, truth


class BurstRecogniser:
    """Finds whole bursts in a waveform: a word per burst, at its onset (a burst cut by
    the window's edge is still reported — at the edge, as a model would half-hear it)."""

    sample_rate = RATE
    window_samples = 30 * RATE
    clock = FrameClock.of(FeatureConfig())

    def __call__(self, waveforms):
        return [self.one(w) for w in waveforms]

    def one(self, samples):
        loud = np.abs(samples) > 0.05
        loud = np.convolve(loud, np.ones(160), mode="same") > 0  # bridge the zero crossings
        edges = np.flatnonzero(np.diff(np.r_[0, loud.astype(int), 0]))
        words, tokens, frames = [], [], []
        for onset, offset in zip(edges[::2], edges[1::2], strict=True):
            peak = np.max(np.abs(samples[onset:offset]))
            level = int(np.argmin([abs(peak - v) for v in LEVELS]))
            frame = max(0, round((onset / RATE - self.clock.offset) / self.clock.period))
            start = self.clock.offset + frame * self.clock.period
            words.append(Word(f"W{level}", start, offset / RATE, 1.0))
            tokens.append(level + 1)
            frames.append(frame)
        best = Hypothesis(tokens, frames, 0.0, " ".join(w.text for w in words), [0.0] * len(words))
        return Decoded(best, Alignment(words, list(range(len(words)))), [best])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cuts_fall_in_pauses_and_segments_fit(seed):
    samples, _truth = bursts(seed)
    windowing = Windowing(max_seconds=4.0, context_seconds=0.5, search_seconds=1.5)
    cuts = cut_points(samples, RATE, windowing)
    assert cuts[0] == 0 and cuts[-1] == len(samples) and len(cuts) > 4
    assert max(np.diff(cuts)) <= 4.0 * RATE
    loud = np.abs(samples) > 0.05
    for cut in cuts[1:-1]:
        assert not loud[cut - 80 : cut + 80].any(), f"cut at {cut / RATE:.2f} s is inside a burst"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_windows_join_every_word_once(seed):
    """The oracle's windows (`tests.decoding.window_oracle`) with a recogniser whose every
    answer is known."""
    samples, truth = bursts(seed)
    windowing = Windowing(max_seconds=4.0, context_seconds=0.8, search_seconds=1.5)
    found = transcribe_in_windows(BurstRecogniser(), samples, windowing)
    assert found.windows == len(plan_windows(samples, RATE, windowing)) > 4
    assert [w.text for w in found.words] == [f"W{level}" for _, level in truth]
    clock = BurstRecogniser.clock
    for word, (onset, _) in zip(found.words, truth, strict=True):
        assert abs(word.start - onset) <= clock.period  # times count from the file's start
    # The joined hypothesis carries the kept words' tokens, frames from the file's start.
    assert found.hypothesis.tokens == [level + 1 for _, level in truth]
    starts = [clock.offset + f * clock.period for f in found.hypothesis.frames]
    assert starts == pytest.approx([w.start for w in found.words], abs=1e-6)
    assert found.text == " ".join(w.text for w in found.words)


def test_a_short_file_is_one_window_with_its_nbest(tmp_path):
    samples, truth = bursts(3, count=4)
    path = tmp_path / "short.wav"
    soundfile.write(path, samples, RATE)
    [found] = transcribe_files(BurstRecogniser(), [path])
    assert found.windows == 1 and len(found.nbest) == 1
    assert [w.text for w in found.words] == [f"W{level}" for _, level in truth]


@pytest.mark.parametrize("trained", [2.5, 4.0, 12.0, 30.0])
def test_the_default_window_fits_what_the_model_was_trained_on(trained):
    """Segment + both contexts <= the longest training utterance, the context a tenth of
    it (at most 1 s), and no warning; a longer window asked for is kept but warned about."""
    windowing, caution = windowing_for(trained)
    whole = windowing.max_seconds + 2 * windowing.context_seconds
    assert whole == pytest.approx(trained) and caution is None
    assert windowing.context_seconds == pytest.approx(min(1.0, trained / 10))
    longer, caution = windowing_for(trained, max_seconds=trained, context_seconds=0.5)
    assert longer.max_seconds == trained and f"({trained:.1f} s)" in caution
    shorter, caution = windowing_for(trained, max_seconds=trained / 2, context_seconds=0.0)
    assert shorter.max_seconds == trained / 2 and caution is None


def test_without_a_record_the_window_is_30_seconds_with_1_second_of_context():
    windowing, caution = windowing_for(None)
    assert (windowing.max_seconds, windowing.context_seconds, caution) == (30.0, 1.0, None)
    assert windowing_for(None, max_seconds=8.0)[0].search_seconds == 4.0


def test_windowing_settings_are_checked():
    with pytest.raises(ValueError, match="search_seconds"):
        Windowing(max_seconds=4.0, search_seconds=3.0)
    with pytest.raises(ValueError):
        Windowing(max_seconds=0.0)


REAL = Path(__file__).parents[1] / "data" / "realspeech" / "test-real" / "9002" / "90021"


@pytest.mark.parametrize("name", ["9002-90021-0001", "9002-90021-0004"])
def test_a_real_clip_repeated_is_cut_between_its_copies(name):
    """Real read speech has pauses inside sentences too; the cuts still pick the pauses
    between the copies (each the quietest stretch in its search range)."""
    clip, rate = soundfile.read(REAL / f"{name}.flac", dtype="float32")
    copies = 5
    duration = len(clip) / rate
    windowing = Windowing(
        max_seconds=1.3 * duration, context_seconds=0.5, search_seconds=0.6 * duration
    )
    cuts = cut_points(np.tile(clip, copies), rate, windowing)
    assert len(cuts) == copies + 1
    for k, cut in enumerate(cuts[1:-1], start=1):
        assert abs(cut / rate - k * duration) < 0.25, (k, cut / rate)


def _fit_to_the_real_clips(work: Path, steps: int = 300):
    """A small LSTM transducer (characters) fitted to the five real clips until it
    transcribes each exactly, on the clips alone and with what a window adds around a
    segment: a fragment of another clip's end before it, of another clip's start after it
    (their words are not in the target). Returns (recogniser factory, {id: clip})."""
    import json

    import keras
    import tensorflow as tf

    from asrkit.audio import read_audio
    from asrkit.config import DataConfig, ExperimentConfig
    from asrkit.decoding.recogniser import Recogniser
    from asrkit.decoding.search.front import DecodeOptions
    from asrkit.decoding.transcribe import NetworkRecogniser
    from asrkit.experiment import build_network
    from asrkit.features import GlobalNormalizer, log_mel
    from asrkit.losses.rnnt import rnnt_loss
    from asrkit.tokenizer import train_tokenizer
    from tests.tiny import tiny_model_config

    lines = (REAL / "9002-90021.trans.txt").read_text().splitlines()
    texts = dict(line.split(" ", 1) for line in lines)
    ids = sorted(texts)
    clips = {i: read_audio(REAL / f"{i}.flac") for i in ids}
    tokenizer = train_tokenizer(list(texts.values()), work / "tokenizer", 40, "char")
    normalizer = GlobalNormalizer.fit(log_mel(c).numpy() for c in clips.values())
    (work / "cmvn.json").write_text(json.dumps(normalizer.to_dict()))
    config = ExperimentConfig(
        model=tiny_model_config(64), data=DataConfig(cmvn=str(work / "cmvn.json"))
    )
    keras.utils.set_random_seed(0)
    network = build_network(config, tokenizer.vocab_size)
    optimizer = keras.optimizers.Adam(3e-3)
    labels = [tokenizer.encode(texts[i]) for i in ids]
    label_array = np.zeros((len(ids), max(map(len, labels))), np.int32)
    for row, label in enumerate(labels):
        label_array[row, : len(label)] = label
    label_lengths = tf.constant([len(label) for label in labels], tf.int32)
    rng = np.random.default_rng(0)
    max_frames = 1100  # the longest clip (7.1 s) with 1.6 s around it, in feature frames

    def example(clip):
        if rng.random() < 0.3:
            return clip
        before, after = clips[ids[rng.integers(len(ids))]], clips[ids[rng.integers(len(ids))]]
        head = int(rng.uniform(0.0, 0.8) * RATE)
        tail = int(rng.uniform(0.0, 0.8) * RATE)
        return np.concatenate([before[len(before) - head :], clip, after[:tail]])

    @tf.function(reduce_retracing=True, autograph=False)
    def step(features, feature_lengths):
        with tf.GradientTape() as tape:
            encoded, lengths = network.encode(features, feature_lengths, training=True)
            logits = network.join(encoded, network.predict_labels(label_array, training=True))
            losses = rnnt_loss(logits, label_array, lengths, label_lengths)
            loss = tf.reduce_sum(losses) / tf.cast(tf.reduce_sum(label_lengths), tf.float32)
        grads = tape.gradient(loss, network.trainable_variables)
        grads, _ = tf.clip_by_global_norm(grads, 5.0)
        optimizer.apply_gradients(zip(grads, network.trainable_variables, strict=True))
        return loss

    for _ in range(steps):
        feats = [log_mel(example(clips[i])).numpy() for i in ids]
        batch = np.zeros((len(ids), max_frames, feats[0].shape[1]), np.float32)
        for row, f in enumerate(feats):
            batch[row, : len(f)] = (f - normalizer.mean) / normalizer.std
        loss = step(tf.constant(batch), tf.constant([len(f) for f in feats], tf.int32))
    assert float(loss) < 0.1, f"the model did not fit the clips (loss {float(loss):.3f}/token)"

    def recogniser(method, windowing=None):
        options = DecodeOptions(method, 4, 3)
        found = Recogniser.of_network(network, tokenizer, config, normalizer, options, windowing)
        return NetworkRecogniser(found, tokenizer)

    return recogniser, {i: texts[i] for i in ids}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    return _fit_to_the_real_clips(tmp_path_factory.mktemp("fitted"))


@pytest.mark.slow  # ~90 s: fits a model to the real clips first
@pytest.mark.parametrize("method", ["greedy", "beam"])
@pytest.mark.parametrize("name", ["9002-90021-0001", "9002-90021-0004"])
def test_a_real_clip_repeated_gives_the_clips_words_once_per_copy(fitted, tmp_path, name, method):
    """A real clip concatenated with itself four times, transcribed in windows (each cut
    between copies, each window hearing 0.5 s of the neighbouring copies) by a model on
    real speech: the words are the single clip's words, four times, none lost or repeated,
    at the single clip's times shifted by each copy's start."""
    recogniser, texts = fitted
    recognise = recogniser(method)
    clip, rate = soundfile.read(REAL / f"{name}.flac", dtype="float32")
    [single] = transcribe_files(recognise, [REAL / f"{name}.flac"])
    assert single.text == texts[name]  # the model knows the clip
    copies, duration = 4, len(clip) / rate
    path = tmp_path / "long.wav"
    soundfile.write(path, np.tile(clip, copies), rate)
    windowing = Windowing(
        max_seconds=1.3 * duration, context_seconds=0.5, search_seconds=0.6 * duration
    )
    [long] = transcribe_files(recogniser(method, windowing), [path])
    assert long.windows == copies
    assert [w.text for w in long.words] == [w.text for w in single.words] * copies
    # Times count from the file's start: each word near its single-clip time shifted by its
    # copy's start (the model, hearing other audio before, may emit a word some frames
    # earlier or later: up to 0.41 s seen for one word; a window placed wrongly would move
    # every word of it by >= 0.5 s).
    shifted = np.array([w.start + k * duration for k in range(copies) for w in single.words])
    error = np.abs(np.array([w.start for w in long.words]) - shifted)
    assert error.max() < 0.5 and np.median(error) <= 0.041, error
