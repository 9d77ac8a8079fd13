"""NeMo's cache-aware streaming FastConformer (a tiny one of the published kind, made by
tools/make_nemo_fixtures.py --parts streaming) imported, against NeMo's own outputs for
every look-ahead it was trained with: the whole utterance's encoder frames and greedy
tokens, and NeMo's cache-aware streaming loop's frames, chunk by chunk, and tokens."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from asrkit.audio import read_audio
from asrkit.decoding.search.front import DecodeOptions, decode_batch
from asrkit.decoding.streaming import StreamingDecoder
from asrkit.experiment import load_experiment
from asrkit.features import log_mel, nemo_settings
from asrkit.importers.nemo_model import import_nemo
from asrkit.nemo_mel import stream_log_mel
from tests.importers.clips import clip_features

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests/data/nemo"
META = json.loads((DATA / "streaming.json").read_text())
ARRAYS = np.load(DATA / "streaming.npz")
CONTEXTS = [tuple(c) for c in META["contexts"]]
CLIPS = range(len(META["clips"]))


def _key(context):
    return f"{context[0]}_{context[1]}"


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    exp = tmp_path_factory.mktemp("streaming") / "exp"
    import_nemo(DATA / "streaming.nemo", exp)
    return exp


def _loaded(exp, context):
    return load_experiment(exp, chunk_frames=context[1] + 1)


def test_the_import_reads_the_cache_aware_settings(experiment):
    encoder = load_experiment(experiment).config.model.encoder
    first_left, first_right = CONTEXTS[0]
    assert encoder.causal_subsampling and encoder.subsampling == "dw_striding"
    assert encoder.chunk_frames == first_right + 1
    assert encoder.left_chunks * encoder.chunk_frames == first_left
    assert encoder.lookaheads == tuple(right for _, right in CONTEXTS)
    assert (encoder.conv_context, encoder.conv_norm) == ("causal", "layer")


@pytest.mark.parametrize("context", CONTEXTS, ids=_key)
def test_the_whole_utterance_is_encoded_and_decoded_as_nemo_does(experiment, context):
    loaded = _loaded(experiment, context)
    encoder = loaded.network.encoder
    for clip in CLIPS:
        n = int(ARRAYS[f"feature_lengths/{clip}"][0])
        features = ARRAYS[f"features/{clip}"][None, :n]
        out, lengths = encoder(tf.constant(features), tf.constant([n]))
        want = ARRAYS[f"{_key(context)}/offline/{clip}"]
        assert int(lengths[0]) == len(want)
        np.testing.assert_allclose(out[0].numpy(), want, atol=1e-4, rtol=0)
    batch, lengths = clip_features(META["clips"], loaded.config.features)
    options = DecodeOptions(max_symbols_per_step=loaded.config.decode.max_symbols_per_step)
    hyps = decode_batch(loaded.network, batch, lengths, loaded.tokenizer, options)
    assert [[t - 1 for t in h.tokens] for h in hyps] == META[_key(context)]["offline"]


def _nemo_chunks(context, frames):
    """NeMo's streaming buffer's feature chunks: the first of 1 + 8R frames, then 8(R+1)."""
    right = context[1]
    first, shift = 1 + 8 * right, 8 * (right + 1)
    bounds = [0, min(first, frames)]
    while bounds[-1] < frames:
        bounds.append(min(bounds[-1] + shift, frames))
    return list(itertools.pairwise(bounds))


@pytest.mark.parametrize("context", CONTEXTS, ids=_key)
def test_the_stream_gives_nemos_streaming_frames_chunk_by_chunk(experiment, context):
    encoder = _loaded(experiment, context).network.encoder
    stream = tf.function(encoder.stream, reduce_retracing=True, autograph=False)
    for clip in CLIPS:
        features = ARRAYS[f"features/{clip}"]  # the whole tensor, as NeMo's buffer has it
        want = ARRAYS[f"{_key(context)}/streaming/{clip}"]
        counts = META[_key(context)]["chunk_frames"][clip]
        state, got = encoder.initial_stream_state(1), []
        for start, stop in _nemo_chunks(context, len(features)):
            out, state = stream(tf.constant(features[None, start:stop]), state)
            got.append(out[0].numpy())
        last, state = encoder.finish_stream(state)
        got[-1] = np.concatenate([got[-1], last[0].numpy()])
        # NeMo's buffer never passes a last piece shorter than the factor (8 frames)
        got = [g for g in got if len(g)]
        assert [len(g) for g in got] == counts
        np.testing.assert_allclose(np.concatenate(got), want, atol=1e-4, rtol=0)


def test_nemos_stream_differs_from_its_whole_utterance_where_asrkit_follows_it():
    """What the stream test proves beyond the whole-utterance test: NeMo's streaming frames
    are not its offline frames (the look-ahead 0 start's pre-encode cache of zeros, the
    features' last zero frame, a last piece shorter than 8 frames dropped)."""
    differs = 0
    for context in CONTEXTS:
        for clip in CLIPS:
            offline = ARRAYS[f"{_key(context)}/offline/{clip}"]
            stream = ARRAYS[f"{_key(context)}/streaming/{clip}"]
            n = min(len(offline), len(stream))
            differs += len(offline) != len(stream) or np.abs(offline[:n] - stream[:n]).max() > 1e-3
    assert differs >= 3


# the first look-ahead and 0 (the stream's start differs there) in the fast tier
WAVEFORM_CONTEXTS = [
    c if c in (CONTEXTS[0], CONTEXTS[-1]) else pytest.param(c, marks=pytest.mark.slow)
    for c in CONTEXTS
]


@pytest.mark.parametrize("context", WAVEFORM_CONTEXTS, ids=_key)
def test_streaming_from_the_waveform_finds_nemos_streaming_tokens(experiment, context):
    loaded = _loaded(experiment, context)
    decoder = StreamingDecoder(loaded.network, loaded.config.features, loaded.normalizer,
                               loaded.config.decode.max_symbols_per_step)  # fmt: skip
    for clip in CLIPS:
        wave = read_audio(ROOT / META["clips"][clip], 16000)
        rng = np.random.default_rng(clip)
        state, position = decoder.initial_state(), 0
        while position < len(wave):
            size = int(rng.integers(1, 6000))
            state = decoder.step(wave[position : position + size], state).state
            position += size
        state = decoder.finish(state).state
        assert (state.tokens.numpy() - 1).tolist() == META[_key(context)]["streaming"][clip]


def test_the_streamed_features_are_nemos_whole_utterance_features(experiment):
    settings = nemo_settings(load_experiment(experiment).config.features)
    for clip in CLIPS:
        wave = read_audio(ROOT / META["clips"][clip], 16000)
        held, got = np.zeros(settings.n_fft // 2 + 1, np.float32), []
        for start in range(0, len(wave), 777):
            held = np.concatenate([held, wave[start : start + 777]])
            frames, drop = stream_log_mel(held, settings, end=False)
            got.append(frames.numpy())
            held = held[int(drop) :]
        got.append(stream_log_mel(held, settings, end=True)[0].numpy())
        got = np.concatenate(got)
        n = int(ARRAYS[f"feature_lengths/{clip}"][0])
        assert len(got) == n
        np.testing.assert_allclose(got, ARRAYS[f"features/{clip}"][:n], atol=1e-3, rtol=0)
        np.testing.assert_allclose(got, log_mel(wave, _features(experiment)), atol=1e-5)


def _features(exp):
    return load_experiment(exp).config.features


def test_a_look_ahead_the_model_was_not_trained_with_is_refused(experiment, capsys):
    from asrkit.cli.main import main

    clip = str(ROOT / META["clips"][1])
    args = ["transcribe", "--exp-dir", str(experiment), clip, "--streaming"]
    assert main([*args, "--lookahead-frames", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--lookahead-frames 5" in err
    assert str(list(right for _, right in CONTEXTS)) in err
    right = CONTEXTS[1][1]
    assert main([*args, "--lookahead-frames", str(right)]) == 0
    text = capsys.readouterr().out.strip().splitlines()[-1].split("\t", 1)[1]
    loaded = _loaded(experiment, CONTEXTS[1])
    nemo = [t + 1 for t in META[_key(CONTEXTS[1])]["streaming"][1]]
    assert text == loaded.tokenizer.decode(nemo).upper()


@pytest.mark.slow
def test_the_streaming_export_and_its_litert_model_stream_as_nemo_does(experiment, tmp_path):
    """`asrkit export --streaming --litert --lookahead-frames 0` (the look-ahead where
    NeMo's stream starts unlike its whole utterance): the SavedModel's stream_step, fed
    pieces of random sizes, and the LiteRT model of the step (0.13 s pieces, its spectrum
    in float32) end each clip with NeMo's cache-aware streaming tokens."""
    from asrkit.cli.main import main
    from tests.test_export import run_litert

    context = CONTEXTS[-1]
    out = tmp_path / "streaming"
    args = ["export", "--exp-dir", str(experiment), "--out", str(out), "--streaming",
            "--litert", "--lookahead-frames", str(context[1])]  # fmt: skip
    assert main(args) == 0
    # what decides its output is recorded: the look-ahead's chunk (look-ahead + 1 frames)
    info = json.loads((out / "asrkit_export.json").read_text())
    assert info["chunk_frames"] == context[1] + 1 and info["search"]["method"] == "greedy"
    paths = [ROOT / clip for clip in META["clips"]]
    want = META[_key(context)]["streaming"]
    loaded = tf.saved_model.load(str(out))
    for path, tokens in zip(paths, want, strict=True):
        samples = read_audio(path, 16000)
        state, got, start = loaded.signatures["initial_state"](), [], 0
        rng = np.random.default_rng(len(samples))
        while start < len(samples):
            size = int(rng.integers(1, 5000))  # pieces of any size
            step = loaded.signatures["stream_step"](
                samples=tf.constant(samples[start : start + size]), **state
            )
            state = {k: v for k, v in step.items() if k.startswith("state_")}
            got += step["tokens"].numpy().tolist()
            start += size
        got += loaded.signatures["stream_finish"](**state)["tokens"].numpy().tolist()
        assert [t - 1 for t in got] == tokens
    lite = run_litert(out / "stream_tokens.tflite", paths)
    assert [[t - 1 for t in r["tokens"]] for r in lite] == want


def test_a_fine_tuned_cache_aware_model_still_streams_as_nemo_does(
    experiment, tmp_path, monkeypatch
):
    """Training `--init-from` the import (its config as the base: its chunks, its look-aheads
    drawn per update, NeMo's features) for an epoch at a negligible learning rate: the dev
    WER is that of NeMo's whole-utterance greedy tokens, and the fine-tuned experiment
    streams NeMo's streaming tokens from the waveform."""
    from asrkit.config import load_config
    from asrkit.metrics import error_rates
    from asrkit.training.trainer import train
    from tests.importers.clip_finetuning import clip_finetuning

    texts = json.loads((DATA / "models.json").read_text())["lines"]
    monkeypatch.chdir(tmp_path)
    utterances = clip_finetuning(experiment, META["clips"], texts)
    result = train(load_config("finetune.yaml"), "ft", init_from=str(experiment))
    tuned = load_experiment("ft")
    assert tuned.config.model.encoder == load_experiment(experiment).config.model.encoder
    first = _key(CONTEXTS[0])
    nemo = [tuned.tokenizer.decode([t + 1 for t in tokens]).upper()
            for tokens in META[first]["offline"]]  # fmt: skip
    want = error_rates([u.text for u in utterances], nemo).wer
    assert want > 0 and result.dev_wer == pytest.approx(want, abs=1e-9)
    decoder = StreamingDecoder(tuned.network, tuned.config.features, tuned.normalizer,
                               tuned.config.decode.max_symbols_per_step)  # fmt: skip
    for clip in CLIPS:
        wave = read_audio(ROOT / META["clips"][clip], 16000)
        state = decoder.step(wave, decoder.initial_state()).state
        state = decoder.finish(state).state
        assert (state.tokens.numpy() - 1).tolist() == META[first]["streaming"][clip]
