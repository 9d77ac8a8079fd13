"""`asrkit import nemo` against NeMo 3.0 itself: two small NeMo transducers trained for a few
CPU minutes on the real clips (a Conformer RNN-T, striding x4, and a FastConformer TDT,
dw_striding x8; `tools/make_nemo_fixtures.py`), with NeMo's own outputs on those clips —
encoder frames, predictor states, joint log-probs, RNN-T losses and greedy_batch's tokens
and frames. asrkit computes its features from the audio itself."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import shutil
import tarfile
from pathlib import Path

import jiwer
import numpy as np
import pytest
import tensorflow as tf
import yaml

from asrkit.audio import read_audio
from asrkit.decoding.search.front import DecodeOptions, decode_batch
from asrkit.experiment import load_experiment
from asrkit.importers.nemo_model import UnsupportedNemoModel, import_nemo
from asrkit.importers.nemo_weights import WeightMismatch
from asrkit.losses import fused_rnnt_loss
from tests.importers.clips import clip_features

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests/data/nemo"
META = json.loads((DATA / "models.json").read_text())
ARRAYS = np.load(DATA / "models.npz")
BEAMS = json.loads((DATA / "beams.json").read_text())
MODELS = ("rnnt", "tdt")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Each fixture model imported once, and NeMo's features of the clips as asrkit
    computes them (a padded batch)."""
    out = {}
    for name in MODELS:
        exp = tmp_path_factory.mktemp(name) / "exp"
        summary = import_nemo(DATA / f"{name}.nemo", exp)
        experiment = load_experiment(exp)
        batch, lengths = clip_features(META["clips"], experiment.config.features)
        out[name] = (summary, experiment, batch, lengths)
    return out


def _asrkit_labels(name):
    targets, lengths = ARRAYS[f"{name}/targets"], ARRAYS[f"{name}/target_lengths"]
    valid = np.arange(targets.shape[1])[None] < lengths[:, None]
    return np.where(valid, targets + 1, 0).astype(np.int32), lengths.astype(np.int32)


@pytest.mark.parametrize("name", MODELS)
def test_the_imported_network_computes_what_nemo_computes(imported, name):
    _, experiment, batch, lengths = imported[name]
    net = experiment.network
    encoded, encoded_lengths = net.encode(batch, lengths)
    want = ARRAYS[f"{name}/encoded"].transpose(0, 2, 1)  # NeMo: [B, D, T]
    want_lengths = ARRAYS[f"{name}/encoded_lengths"]
    np.testing.assert_array_equal(encoded_lengths.numpy(), want_lengths)
    for row, n in enumerate(want_lengths):  # from the waveform: features, then encoder
        np.testing.assert_allclose(encoded.numpy()[row, :n], want[row, :n], atol=1e-4)
    labels, label_lengths = _asrkit_labels(name)
    predicted = net.predict_labels(tf.constant(labels)).numpy()
    want_pred = ARRAYS[f"{name}/predicted"].transpose(0, 2, 1)
    for row, u in enumerate(label_lengths):
        np.testing.assert_allclose(predicted[row, : u + 1], want_pred[row, : u + 1], atol=1e-5)
    # The joint at NeMo's sampled (b, t, u) cells: NeMo's CPU joint log-softmaxes its whole
    # output (tokens, blank last, then TDT durations); asrkit's blank is first.
    at = ARRAYS[f"{name}/joint_at"]
    enc_at = tf.gather_nd(encoded, at[:, :2])
    pred_at = tf.gather_nd(predicted, at[:, [0, 2]])
    logits = net.joint(enc_at, pred_at).numpy()
    mine = [logits[:, 1:], logits[:, :1]]
    if net.joint.durations:
        mine.append(net.joint.duration_logits(enc_at, pred_at).numpy())
    mine = tf.nn.log_softmax(np.concatenate(mine, axis=1)).numpy()
    np.testing.assert_allclose(mine, ARRAYS[f"{name}/joint"], atol=2e-4)


def test_the_fused_relu_loss_of_the_imported_model_is_nemos_rnnt_loss(imported):
    _, experiment, batch, lengths = imported["rnnt"]
    net = experiment.network
    encoded, encoded_lengths = net.encode(batch, lengths)
    labels, label_lengths = _asrkit_labels("rnnt")
    enc_h, pred_h = net.joint.project(encoded, net.predict_labels(tf.constant(labels)))
    out = net.joint.output_layer
    losses = fused_rnnt_loss(
        enc_h, pred_h, labels, encoded_lengths, label_lengths, kernel=out.kernel, bias=out.bias,
        activation="relu",
    )  # fmt: skip
    np.testing.assert_allclose(losses.numpy(), ARRAYS["rnnt/rnnt_losses"], rtol=1e-4)


@pytest.mark.parametrize("name", MODELS)
def test_greedy_search_finds_nemos_tokens_at_nemos_frames(imported, name):
    _, experiment, batch, lengths = imported[name]
    options = DecodeOptions(max_symbols_per_step=experiment.config.decode.max_symbols_per_step)
    hyps = decode_batch(experiment.network, batch, lengths, experiment.tokenizer, options)
    emitted = 0
    for row, hyp in enumerate(hyps):
        assert [t - 1 for t in hyp.tokens] == META[name]["greedy"][row]  # asrkit id = NeMo + 1
        assert hyp.frames == META[name]["frames"][row]
        assert hyp.text == " ".join(META[name]["text"][row].upper().split())
        emitted += len(hyp.tokens)
    assert emitted > 20  # the fixture models are trained: they emit
    # One utterance alone (a test set's last batch), in a search traced first for that
    # static shape (a fresh trace cache): the same tokens and frames.
    experiment.network.__dict__.pop("_asrkit_search", None)
    n = int(lengths[0])
    alone = decode_batch(experiment.network, batch[:1, :n], lengths[:1], experiment.tokenizer,
                         options)  # fmt: skip
    assert alone[0].tokens == hyps[0].tokens and alone[0].frames == hyps[0].frames


def test_the_tokenizer_gives_nemos_ids_plus_one(imported):
    summary, experiment, _, _ = imported["rnnt"]
    labels, lengths = _asrkit_labels("rnnt")
    for row, line in enumerate(META["lines"]):
        assert experiment.tokenizer.encode(line.upper()) == labels[row, : lengths[row]].tolist()
    assert summary.lower_case and experiment.tokenizer.vocab_size == summary.vocabulary + 1


def test_the_experiment_states_the_model_the_features_and_the_search(imported):
    summary, experiment, _, _ = imported["tdt"]
    config = experiment.config
    assert summary.plan.kind == "TDT" and config.model.durations == (0, 1, 2, 3, 4)
    encoder = config.model.encoder
    assert (encoder.kind, encoder.attention, encoder.subsampling, encoder.subsampling_factor) == (
        "conformer", "relative", "dw_striding", 8,
    )  # fmt: skip
    assert (encoder.norm_epsilon, encoder.batch_norm_momentum, encoder.final_norm) == (
        1e-5, 0.9, "block",
    )  # fmt: skip
    assert config.features.kind == "nemo" and config.features.normalize == "per_feature"
    assert config.decode.max_symbols_per_step == 5  # NeMo's decoding.greedy.max_symbols
    assert config.data.cmvn is None and encoder.conv_norm == "frozen_batch"


def _rewrite(source: Path, target: Path, edit=None, drop: str | None = None) -> Path:
    """A copy of a .nemo archive with its config edited or a member left out."""
    with tarfile.open(source) as archive:
        members = [(m, archive.extractfile(m).read() if m.isfile() else None)
                   for m in archive.getmembers()]  # fmt: skip
    with tarfile.open(target, "w") as out:
        for info, body in members:
            if drop and info.name.endswith(drop):
                continue
            if info.name.endswith("model_config.yaml") and edit is not None:
                config = yaml.safe_load(body)
                edit(config)
                body = yaml.safe_dump(config).encode()
                info.size = len(body)
            out.addfile(info, io.BytesIO(body) if body is not None else None)
    return target


def _set(path: str, value):
    def edit(config):
        node = config
        *parents, key = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[key] = value

    return edit


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("encoder.self_attention_model", "abs_pos"),
        ("encoder.att_context_size", [64, 0]),
        ("encoder.conv_norm_type", "groupnorm2"),
        ("encoder.subsampling", "vggnet"),
        ("encoder._target_", "nemo.collections.asr.modules.SqueezeformerEncoder"),
        ("joint.jointnet.activation", "sigmoid"),
        ("tokenizer.type", "wpe"),
        ("preprocessor.window", "hamming"),
        ("preprocessor.normalize", "all_features"),
        ("decoder.prednet.rnn_hidden_size", 48),
        ("target", "nemo.collections.asr.models.EncDecCTCModelBPE"),
    ],
)
def test_an_unsupported_setting_is_refused_by_key_and_value_leaving_nothing(tmp_path, key, value):
    model = _rewrite(DATA / "rnnt.nemo", tmp_path / "edited.nemo", _set(key, value))
    exp = tmp_path / "exp"
    with pytest.raises(UnsupportedNemoModel) as error:
        import_nemo(model, exp)
    assert key in str(error.value) and repr(value) in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edited.nemo"]


@pytest.mark.parametrize(("max_duration", "want"), [(16.7, 16.7), (None, 20.0)])
def test_the_import_records_how_long_the_training_utterances_were(tmp_path, max_duration, want):
    """NeMo's train_ds.max_duration (or, where the config has none, the stated 20 s of its
    templates) becomes the experiment's training length: transcribe's windows fit it."""
    from asrkit.cli.transcribe import _training_max_seconds
    from asrkit.experiment import read_training_lengths

    edit = _set("train_ds", {"max_duration": max_duration}) if max_duration else None
    model = _rewrite(DATA / "rnnt.nemo", tmp_path / "edited.nemo", edit)
    summary = import_nemo(model, tmp_path / "exp")
    lengths = read_training_lengths(summary.exp_dir)
    assert lengths.max_seconds == want
    assert ("max_duration" in lengths.source) and (("20 s" in lengths.source) == (not max_duration))
    args = argparse.Namespace(model=None, exp_dir=str(summary.exp_dir))
    assert _training_max_seconds(args) == want


def test_weights_that_do_not_fit_the_config_are_refused_leaving_nothing(tmp_path):
    model = _rewrite(DATA / "rnnt.nemo", tmp_path / "edited.nemo", _set("encoder.d_model", 48))
    with pytest.raises(WeightMismatch, match=r"edited\.nemo: encoder\.pre_encode\.out\.weight"):
        import_nemo(model, tmp_path / "exp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edited.nemo"]


def test_an_archive_without_its_tokenizer_is_refused_by_member(tmp_path):
    model = _rewrite(DATA / "rnnt.nemo", tmp_path / "edited.nemo", drop="_tokenizer.model")
    with pytest.raises(Exception, match=r"tokenizer\.model, not in the archive"):
        import_nemo(model, tmp_path / "exp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edited.nemo"]


def test_the_command_imports_and_the_moved_experiment_transcribes_as_nemo(
    tmp_path, monkeypatch, capsys
):
    from asrkit.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main(["import", "nemo", str(DATA / "tdt.nemo"), "--exp-dir", "imported"]) == 0
    said = capsys.readouterr().out
    assert "FastConformer-TDT" in said and "48 SentencePiece pieces + blank" in said
    assert main(["import", "nemo", str(DATA / "tdt.nemo"), "--exp-dir", "imported"]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert main(["import", "nemo", "missing.nemo", "--exp-dir", "other"]) == 2
    assert "missing.nemo: no such .nemo file" in capsys.readouterr().err
    Path("notes.nemo").write_text("not an archive")
    assert main(["import", "nemo", "notes.nemo", "--exp-dir", "other"]) == 2
    assert capsys.readouterr().err.strip().endswith("notes.nemo: not a .nemo archive (a .nemo "
                                                    "file is a tar archive; this is none, or a "
                                                    "damaged one)")  # fmt: skip
    assert not (tmp_path / "other").exists()
    (tmp_path / "imported").rename(tmp_path / "moved")
    clips = [str(ROOT / clip) for clip in META["clips"]]
    assert main(["transcribe", "--exp-dir", "moved", *clips]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    texts = [line.split("\t", 1)[1] if "\t" in line else "" for line in lines]
    assert texts == [" ".join(t.upper().split()) for t in META["tdt"]["text"]]


@pytest.mark.parametrize("method", ["greedy", pytest.param("beam", marks=pytest.mark.slow)])
def test_an_exported_imported_tdt_model_serves_nemos_tokens(imported, tmp_path, method):
    """The SavedModel computes NeMo's features in the graph and runs the TDT greedy or
    beam search: both signatures give NeMo's tokens (greedy_batch's, malsd_batch's) for
    the real clips."""
    from asrkit.export import export_model

    summary, experiment, _, _ = imported["tdt"]
    options = DecodeOptions(method, BEAMS["beam"], experiment.config.decode.max_symbols_per_step)
    out = export_model(summary.exp_dir, tmp_path / "saved", options=options)
    saved = tf.saved_model.load(str(out))
    waves = [read_audio(ROOT / clip, 16000) for clip in META["clips"]]
    lengths = np.array([len(w) for w in waves], np.int32)
    padded = np.zeros((len(waves), lengths.max()), np.float32)
    for row, wave in enumerate(waves):
        padded[row, : len(wave)] = wave
    batch = saved.signatures["serve_batch"](waveforms=tf.constant(padded),
                                             lengths=tf.constant(lengths))  # fmt: skip
    for row, wave in enumerate(waves):
        want = META["tdt"]["greedy"][row] if method == "greedy" else BEAMS["tdt"]["tokens"][row]
        n = int(batch["token_counts"][row])
        assert [t - 1 for t in batch["tokens"].numpy()[row, :n]] == want
        one = saved.signatures["serving_default"](waveform=tf.constant(wave))
        assert [t - 1 for t in one["tokens"].numpy()[: int(one["token_counts"])]] == want


def test_an_imported_model_fine_tunes_with_init_from(imported, tmp_path, monkeypatch):
    """`asrkit features extract` with the imported config (NeMo's features) and the model's
    tokenizer, then training `--init-from` the import with a config based on the imported
    one: every variable is loaded, and after an epoch at a negligible learning rate the
    dev WER is that of NeMo's own greedy transcripts of the clips."""
    from tests.importers.clip_finetuning import clip_finetuning

    summary, experiment, _, _ = imported["rnnt"]
    exp = summary.exp_dir
    monkeypatch.chdir(tmp_path)
    utterances = clip_finetuning(exp, META["clips"], META["lines"])
    from asrkit.config import load_config
    from asrkit.training.trainer import train

    logged = []
    result = train(load_config("finetune.yaml"), "ft", init_from=str(exp), log=logged.append)
    loaded = next(line for line in logged if line.startswith("initialised"))
    assert int(loaded.split()[1]) >= len(experiment.network.weights)  # + dropout RNG states
    assert not any("not loaded" in line or "left fresh" in line for line in logged)
    from asrkit.metrics import error_rates

    nemo_wer = error_rates([u.text for u in utterances], META["rnnt"]["text"]).wer
    assert 0 < nemo_wer < 1 and result.dev_wer == pytest.approx(nemo_wer, abs=1e-9)


@pytest.mark.slow
def test_plan_measures_the_imported_model_itself(imported, tmp_path, monkeypatch, capsys):
    """`asrkit plan --exp-dir IMPORTED` (no --config) plans the imported model from its
    recorded config and tokenizer, from any directory; only the training shards are named
    (relative to where it runs). Also with `--config IMPORTED/config.yaml`."""
    from asrkit.cli.main import main
    from asrkit.config import load_config
    from asrkit.data.batch_plan import load_plan, memory_fingerprint
    from asrkit.data.manifest import Utterance, write_manifest

    summary, _, _, _ = imported["rnnt"]
    exp = tmp_path / "imported"
    shutil.copytree(summary.exp_dir, exp)
    monkeypatch.chdir(tmp_path)
    clips = [Utterance(Path(c).stem, str(ROOT / c), len(read_audio(ROOT / c, 16000)) / 16000,
                       line.upper(), "9002")
             for c, line in zip(META["clips"], META["lines"], strict=True)]  # fmt: skip
    write_manifest("clips.jsonl", clips)
    assert main(["features", "extract", "--manifest", "clips.jsonl", "--tokenizer",
                 str(exp / "tokenizer"), "--out", "shards", "--shards", "1",
                 "--config", str(exp / "config.yaml")]) == 0  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()  # without shards: the import's missing data is named, and the fix
    assert main(["plan", "--exp-dir", str(exp), "--memory", "2GiB"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "an imported model comes without training data" in err[0], err
    assert "--set data.train_shards=DIR" in err[0] and not (exp / "plan.json").exists()
    for config in ([], ["--config", str(exp / "config.yaml")]):
        capsys.readouterr()
        argv = ["plan", "--exp-dir", str(exp), "--memory", "2GiB", "--device", "CPU:0",
                "--set", f"data.train_shards={tmp_path / 'shards'}", *config]  # fmt: skip
        assert main(argv) == 0, capsys.readouterr().err
        plan = load_plan(exp / "plan.json")
        recorded = load_config(exp / "config.yaml")
        assert plan.measured_for["model"] == memory_fingerprint(recorded)["model"]
        assert plan.buckets and all(b.micro_batch >= 1 for b in plan.buckets)


@pytest.mark.parametrize("name", MODELS)
def test_beam_search_finds_the_best_hypothesis_nemos_beam_search_finds(imported, name):
    """NeMo's malsd_batch (beam 4, unnormalised scores) on the committed archives. For
    TDT it is the search asrkit's TDT beam search makes; for RNN-T NeMo's is a
    label-synchronous search and asrkit's is frame-synchronous (modified beam search), so
    the two may rank differently: there asrkit's best must score at least NeMo's."""
    _, experiment, batch, lengths = imported[name]
    want = BEAMS[name]
    options = DecodeOptions("beam", BEAMS["beam"],
                            experiment.config.decode.max_symbols_per_step)  # fmt: skip
    hyps = decode_batch(experiment.network, batch, lengths, experiment.tokenizer, options)
    for row, hyp in enumerate(hyps):
        if name == "tdt":
            assert [t - 1 for t in hyp.tokens] == want["tokens"][row]
            assert hyp.frames == want["frames"][row]
            assert hyp.score == pytest.approx(want["scores"][row], abs=2e-3)
        else:
            assert hyp.score >= want["scores"][row] - 2e-3
    greedy = decode_batch(experiment.network, batch, lengths, experiment.tokenizer,
                          dataclasses.replace(options, method="greedy"))  # fmt: skip
    assert all(b.score >= g.score - 1e-4 for b, g in zip(hyps, greedy, strict=True))


def test_transcribe_takes_nemos_token_lm_for_an_imported_model(tmp_path, capsys):
    """An LM in NeMo's token encoding (token k as chr(k + 100), as NeMo's train_kenlm.py
    writes one for a BPE model) over the model's tokens: `transcribe --lm` of the imported
    experiment searches with the tables `lm_automaton` makes of it through NeMo's ids (and
    they change what it finds)."""
    from asrkit.cli.main import main
    from asrkit.decoding.fusion.lm import lm_automaton, nemo_token_names
    from asrkit.decoding.fusion.tables import combine
    from asrkit.decoding.transcribe import NetworkRecogniser, transcribe_files
    from asrkit.ngram import estimate, read_arpa, write_arpa

    exp = tmp_path / "exp"
    assert main(["import", "nemo", str(DATA / "rnnt.nemo"), "--exp-dir", str(exp)]) == 0
    experiment = load_experiment(exp)
    vocab = experiment.network.vocab_size
    names = nemo_token_names(vocab)
    rng = np.random.default_rng(0)
    text = [[names[t] for t in rng.integers(1, vocab, 6)] for _ in range(50)]
    arpa = write_arpa(estimate(text, 2, names[1:]), tmp_path / "nemo.arpa")
    pieces = [experiment.tokenizer.piece(i) for i in range(vocab)]
    tables = combine(lm_automaton(read_arpa(arpa), pieces, 2.0, nemo_ids=True))
    options = DecodeOptions("beam", beam=3)
    clips = [ROOT / clip for clip in META["clips"]]
    plain = [t.text for t in transcribe_files(NetworkRecogniser.of(experiment, options), clips)]
    want = [t.text for t in transcribe_files(
        NetworkRecogniser.of(experiment, options, tables), clips)]  # fmt: skip
    assert want != plain
    capsys.readouterr()
    assert main(["transcribe", "--exp-dir", str(exp), "--method", "beam", "--beam", "3",
                 "--lm", str(arpa), "--lm-weight", "2", *map(str, clips)]) == 0  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t", 1)[1] if "\t" in line else "" for line in lines] == want


@pytest.mark.parametrize("name", MODELS)
def test_a_bfloat16_encoder_stays_near_nemos_frames_and_finds_its_tokens(imported, name):
    """`--precision bfloat16`: the encoder's weights rounded once to bfloat16 and its
    products in bfloat16; its frames within 5 % (relative RMS, per utterance; 0.5-3 % on
    these small models, about 1 % at 114 M) of NeMo's float32 frames, and the search on
    them finds the RNN-T model's greedy tokens at NeMo's frames. The TDT model's search
    (a duration decided at every emission) strays: 24 % of its tokens differ from NeMo's
    (printed; RESULTS.md): these models trained a few CPU minutes, so their decisions sit
    closer to ties than a trained model's, and a TDT search that skips differently once
    goes on differently. The float32 network's frames are 1e-4 from NeMo's and its tokens
    NeMo's (above), so the gaps are the precision's."""
    summary, float32, batch, lengths = imported[name]
    experiment = load_experiment(summary.exp_dir, precision="bfloat16")
    net = experiment.network
    assert net.encoder.compute_dtype == "bfloat16"
    encoded, _ = net.encode(batch, lengths)
    assert encoded.dtype == tf.float32  # the joint and the search see float32 frames
    want = ARRAYS[f"{name}/encoded"].transpose(0, 2, 1)
    mine32 = float32.network.encode(batch, lengths)[0].numpy()
    worst = 0.0
    for row, n in enumerate(ARRAYS[f"{name}/encoded_lengths"]):
        got, ref = encoded.numpy()[row, :n], want[row, :n]
        relative = np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref**2))
        assert 1e-4 < relative < 5e-2, relative  # bfloat16's rounding, within the tolerance
        worst = max(worst, relative)
        assert not np.array_equal(got, mine32[row, :n])
    options = DecodeOptions(max_symbols_per_step=experiment.config.decode.max_symbols_per_step)
    hyps = decode_batch(net, batch, lengths, experiment.tokenizer, options)
    tokens = [" ".join(str(t - 1) for t in hyp.tokens) for hyp in hyps]
    nemos = [" ".join(map(str, row)) for row in META[name]["greedy"]]
    edits = jiwer.process_words(nemos, tokens)
    rate = (edits.substitutions + edits.deletions + edits.insertions) / sum(
        len(row) for row in META[name]["greedy"]
    )
    print(f"{name}: bfloat16 frames within {worst:.4f} of NeMo's (relative RMS), tokens "
          f"{rate:.3f} from NeMo's greedy tokens")  # fmt: skip
    if not experiment.config.model.durations:  # RNN-T: NeMo's tokens at NeMo's frames
        for row, hyp in enumerate(hyps):
            assert [t - 1 for t in hyp.tokens] == META[name]["greedy"][row]
            assert hyp.frames == META[name]["frames"][row]
