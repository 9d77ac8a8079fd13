"""Streaming recognition: a waveform fed in pieces of any size finds exactly the tokens and
frames that greedy search finds on the whole waveform, and keeps exactly the hypotheses
beam search keeps on it — with the causal LSTM encoder and with chunked Conformers (own
chunk + 1 chunk of history, or all history)."""

import dataclasses
from pathlib import Path

import keras
import numpy as np
import pytest
import soundfile
import tensorflow as tf

from asrkit.config import EncoderConfig, FeatureConfig
from asrkit.decoding.search.beam import beam_found, beam_search
from asrkit.decoding.search.front import found_hypotheses
from asrkit.decoding.search.greedy import greedy_search, greedy_start
from asrkit.decoding.streaming import StreamingDecoder
from asrkit.errors import UserError
from asrkit.features import GlobalNormalizer, log_mel
from asrkit.models.transducer import Transducer
from tests.tiny import tiny_model_config

REAL = Path(__file__).parents[1] / "data" / "realspeech" / "test-real" / "9002" / "90021"
FEATURES = FeatureConfig()


ENCODERS = {
    "lstm": EncoderConfig(kind="lstm", lstm_units=16, lstm_layers=1, subsampling_filters=8),
    "conformer, 1 chunk back": EncoderConfig(
        kind="conformer", d_model=16, num_blocks=2, num_heads=2, kernel_size=5,
        subsampling_filters=8, dropout=0.0, chunk_frames=4, left_chunks=1, final_norm="encoder",
    ),
    "conformer, all back": EncoderConfig(
        kind="conformer", d_model=16, num_blocks=2, num_heads=2, kernel_size=5,
        subsampling_filters=8, dropout=0.0, chunk_frames=8, left_chunks=-1, final_norm="block",
        conv_context="causal",
    ),
    # NeMo's attention and scaling on asrkit's chunks (its chunked_limited context)
    "conformer, relative positions": EncoderConfig(
        kind="conformer", d_model=16, num_blocks=2, num_heads=2, kernel_size=5,
        subsampling_filters=8, dropout=0.0, chunk_frames=4, left_chunks=2, final_norm="block",
        attention="relative", xscaling=True, norm_epsilon=1e-5, use_bias=False,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def clip():
    samples, _ = soundfile.read(REAL / "9002-90021-0001.flac", dtype="float32")
    return samples


@pytest.fixture(scope="module")
def normalize(clip):
    return GlobalNormalizer.fit([log_mel(clip, FEATURES).numpy()])


@pytest.fixture(
    scope="module",
    params=[
        "lstm",
        pytest.param("conformer, 1 chunk back", marks=pytest.mark.slow),
        pytest.param("conformer, all back", marks=pytest.mark.slow),
        pytest.param("conformer, relative positions", marks=pytest.mark.slow),
    ],
)
def network(request, clip, normalize):
    keras.utils.set_random_seed(5)
    config = dataclasses.replace(tiny_model_config(units=16), encoder=ENCODERS[request.param])
    network = Transducer(9, config)
    network.build_from_features(FEATURES.num_mel_bins)
    return emitting_some(network, clip, normalize)


def emitting_some(network, clip, normalize):
    """Random weights emit a token at almost every frame, or at none: a blank bias at the
    median margin of the clip's frames makes some frames emit nothing and some several,
    as a trained model does."""
    features = normalize(log_mel(clip, FEATURES))[None]
    encoded, _ = network.encode(features, tf.shape(features)[1][None])
    start, _ = greedy_start(network, 1)
    logits = network.join(encoded[0], start).numpy()
    margin = np.median(logits[:, 1:].max(axis=-1) - logits[:, 0])
    kernel, bias = network.joint.output_layer.get_weights()
    bias[0] += margin
    network.joint.output_layer.set_weights([kernel, bias])
    return network


def whole(network, samples, normalize):
    features = normalize(log_mel(samples, FEATURES))[None]
    encoded, lengths = network.encode(features, tf.shape(features)[1][None])
    found = greedy_search(network, encoded, lengths)
    count = int(found.counts[0])
    return found.tokens[0, :count].numpy(), found.frames[0, :count].numpy(), int(lengths[0])


def streamed(decoder, samples, sizes, states=None):
    """Feeds `samples` in pieces of `sizes`, then finishes -> (tokens, frames, last state);
    each piece's state is appended to `states` if given."""
    state, tokens, frames, start = decoder.initial_state(), [], [], 0
    for size in sizes:
        step = decoder.step(samples[start : start + size], state)
        tokens += step.tokens.numpy().tolist()
        frames += step.token_frames.numpy().tolist()
        state, start = step.state, start + size
        if states is not None:
            states.append(state)
    assert start >= len(samples)
    last = decoder.finish(state)
    tokens += last.tokens.numpy().tolist()
    frames += last.token_frames.numpy().tolist()
    state = last.state
    assert state.tokens.numpy().tolist() == tokens
    return np.array(tokens), np.array(frames), state


@pytest.mark.parametrize(
    "pieces",
    [
        "random",
        *(pytest.param(p, marks=pytest.mark.slow) for p in ("one frame", "one piece", "tiny")),
    ],
)
def test_pieces_of_any_size_find_the_whole_waveforms_tokens(network, clip, normalize, pieces):
    want_tokens, want_frames, encoder_length = whole(network, clip, normalize)
    per_frame = np.bincount(want_frames, minlength=encoder_length)
    assert (per_frame == 0).sum() > 5 and (per_frame >= 2).sum() > 5, per_frame
    rng = np.random.default_rng(len(pieces))
    sizes = {
        "random": rng.choice([0, 1, 7, 159, 160, 399, 400, 401, 1234, 4000, 9999], size=60),
        "one frame": [160] * 100,
        "one piece": [len(clip)],
        "tiny": rng.integers(1, 40, size=100),
    }[pieces]
    sizes = [*sizes, len(clip)]  # whatever is left
    decoder = StreamingDecoder(network, FEATURES, normalize)
    tokens, frames, state = streamed(decoder, clip, sizes)
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_array_equal(frames, want_frames)
    assert int(state.frames) == encoder_length
    assert len(state.samples) < FEATURES.frame_length and len(state.features) < 7
    # The same decoder streams again in other pieces: its step and its finish were each
    # traced once for both streams (a trace of a 17-block Conformer's step takes seconds).
    again, _, _ = streamed(decoder, clip, [*rng.integers(1, 5000, size=20), len(clip)])
    np.testing.assert_array_equal(again, want_tokens)
    assert decoder._compiled.experimental_get_tracing_count() == 1
    assert decoder._compiled_finish.experimental_get_tracing_count() == 1


def hypotheses(found):
    """The live hypotheses of row 0 as (tokens, frames, score), best first."""
    return [(h.tokens, h.frames, h.score) for h in found_hypotheses(found, None)[0]]


def test_a_stream_keeps_the_hypotheses_beam_search_keeps_on_the_whole(network, clip, normalize):
    features = normalize(log_mel(clip, FEATURES))[None]
    encoded, lengths = network.encode(features, tf.shape(features)[1][None])
    want = hypotheses(beam_search(network, encoded, lengths, beam=4, max_symbols_per_step=3))
    assert len(want) == 4 and len({tuple(t) for t, _, _ in want}) == 4
    decoder = StreamingDecoder(network, FEATURES, normalize, max_symbols_per_step=3, beam=4)
    rng = np.random.default_rng(3)
    sizes = [*rng.choice([0, 1, 159, 400, 1234, 4000, 9999], size=40), len(clip)]
    state, start, revised = decoder.initial_state(), 0, 0
    for size in sizes:
        step = decoder.step(clip[start : start + size], state)
        before = state.tokens.numpy().tolist()
        state, start = step.state, start + size
        now = state.tokens.numpy().tolist()
        assert step.tokens.numpy().tolist() == now  # beam: the best hypothesis so far
        revised += now[: len(before)] != before
    state = decoder.finish(state).state
    got = hypotheses(beam_found(state.carry))
    assert [(t, f) for t, f, _ in got] == [(t, f) for t, f, _ in want]
    np.testing.assert_allclose([s for *_, s in got], [s for *_, s in want], rtol=1e-5)
    assert state.tokens.numpy().tolist() == want[0][0]
    assert state.token_frames.numpy().tolist() == want[0][1]
    print(f"the best hypothesis so far was revised after {revised} of {len(sizes)} pieces")


def test_a_conformer_cannot_stream():
    config = dataclasses.replace(
        tiny_model_config(), encoder=EncoderConfig(kind="conformer", d_model=16, num_heads=2)
    )
    with pytest.raises(UserError, match="chunk_frames"):
        StreamingDecoder(Transducer(9, config), FEATURES)


@pytest.fixture(
    scope="module",
    params=["lstm", pytest.param("conformer, 1 chunk back", marks=pytest.mark.slow)],
)
def tdt_network(request, clip, normalize):
    """A TDT network whose durations favour jumps of 2-4 frames, with some blanks."""
    keras.utils.set_random_seed(6)
    config = dataclasses.replace(
        tiny_model_config(units=16), encoder=ENCODERS[request.param], durations=(0, 1, 2, 3, 4)
    )
    network = Transducer(9, config)
    network.build_from_features(FEATURES.num_mel_bins)
    emitting_some(network, clip, normalize)
    kernel, bias = network.joint.duration_layer.get_weights()
    network.joint.duration_layer.set_weights([kernel, bias + np.array([0.0, 0.5, 1.0, 1.0, 1.0])])
    return network


def test_a_tdt_stream_finds_the_whole_waveforms_tokens(tdt_network, clip, normalize):
    from asrkit.decoding.search.tdt_greedy import tdt_greedy_search

    features = normalize(log_mel(clip, FEATURES))[None]
    encoded, lengths = tdt_network.encode(features, tf.shape(features)[1][None])
    found = tdt_greedy_search(tdt_network, encoded, lengths)
    count = int(found.counts[0])
    want_tokens, want_frames = found.tokens[0, :count].numpy(), found.frames[0, :count].numpy()
    assert count > 10 and np.diff(want_frames).max() >= 2  # tokens, and jumps between them
    decoder = StreamingDecoder(tdt_network, FEATURES, normalize)
    rng = np.random.default_rng(4)
    sizes = [*rng.choice([0, 1, 159, 160, 400, 401, 1234, 4000], size=60), len(clip)]
    states = []
    tokens, frames, _ = streamed(decoder, clip, sizes, states)
    jumped = sum(int(state.carry[2][0]) > 0 for state in states)  # into the next piece
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_array_equal(frames, want_frames)
    assert jumped > 3, jumped


def test_a_tdt_model_streams_greedily_only(tdt_network):
    with pytest.raises(UserError, match="greedy search only"):
        StreamingDecoder(tdt_network, FEATURES, beam=4)


def _boost_from(tokens, vocab_size):
    """Word-boosting tables of phrases near what the search finds (pairs of its tokens,
    shifted to other ids, so boosting changes the result), with an LM of those shifted
    tokens beside them: two automata."""
    from asrkit.decoding.fusion.boosting import boost_tables
    from asrkit.decoding.fusion.lm import lm_automaton
    from asrkit.decoding.fusion.tables import combine
    from asrkit.ngram import estimate

    shifted = [t % (vocab_size - 1) + 1 for t in tokens]
    pairs = {tuple(shifted[i : i + 2]): 1.5 for i in range(0, len(tokens) - 1, 5)}
    pieces = ["<blank>", *(f"p{i}" for i in range(1, vocab_size))]
    lm = estimate([[pieces[t] for t in shifted]], 3, pieces[1:])
    return combine(boost_tables(pairs, vocab_size), lm_automaton(lm, pieces, 0.3))


@pytest.mark.parametrize("beam", [1, 4])
def test_a_boosted_stream_finds_what_boosted_search_finds_on_the_whole(
    network, clip, normalize, beam
):
    """Word boosting while streaming: the automaton state rides in the carry, so pieces of
    any size end with the boosted whole-waveform search's tokens (and, for beam search, its
    best hypothesis's score: open matches taken back at the stream's end)."""
    from asrkit.decoding.fusion.steps import as_tensors

    features = normalize(log_mel(clip, FEATURES))[None]
    encoded, lengths = network.encode(features, tf.shape(features)[1][None])
    plain, _, _ = whole(network, clip, normalize)
    tables = _boost_from(plain.tolist(), network.vocab_size)
    boost = as_tensors(tables)
    if beam == 1:
        found = greedy_search(network, encoded, lengths, boost=boost)
        want = found.tokens[0, : found.counts[0]].numpy().tolist()
        want_score = None
    else:
        found = beam_search(network, encoded, lengths, beam, 3, boost=boost)
        want = found.tokens[0, 0, : found.counts[0, 0]].numpy().tolist()
        want_score = float(found.scores[0, 0])
    assert want != plain.tolist()  # boosting changed the result
    decoder = StreamingDecoder(network, FEATURES, normalize, max_symbols_per_step=3,
                               beam=beam, boost=tables)  # fmt: skip
    rng = np.random.default_rng(8)
    sizes = [*rng.choice([0, 1, 159, 400, 1234, 4000], size=40), len(clip)]
    state, start = decoder.initial_state(), 0
    for size in sizes:
        state, start = decoder.step(clip[start : start + size], state).state, start + size
    state = decoder.finish(state).state
    assert state.tokens.numpy().tolist() == want
    if want_score is not None:
        assert float(state.score) == pytest.approx(want_score, rel=1e-5)


def test_a_boosted_tdt_stream_finds_what_boosted_search_finds_on_the_whole(
    tdt_network, clip, normalize
):
    from asrkit.decoding.fusion.steps import as_tensors
    from asrkit.decoding.search.tdt_greedy import tdt_greedy_search

    features = normalize(log_mel(clip, FEATURES))[None]
    encoded, lengths = tdt_network.encode(features, tf.shape(features)[1][None])
    plain = tdt_greedy_search(tdt_network, encoded, lengths)
    tables = _boost_from(plain.tokens[0, : plain.counts[0]].numpy().tolist(), 9)
    found = tdt_greedy_search(tdt_network, encoded, lengths,
                              boost=as_tensors(tables))  # fmt: skip
    want = found.tokens[0, : found.counts[0]].numpy().tolist()
    assert want != plain.tokens[0, : plain.counts[0]].numpy().tolist()
    decoder = StreamingDecoder(tdt_network, FEATURES, normalize, boost=tables)
    rng = np.random.default_rng(9)
    sizes = [*rng.choice([0, 1, 159, 160, 400, 1234, 4000], size=60), len(clip)]
    tokens, _, _ = streamed(decoder, clip, sizes)
    assert tokens.tolist() == want
