"""Fine-tuning an imported model as NeMo fine-tunes it, against NeMo 3.0's own training
step (`tools/make_nemo_fixtures.py --parts steps`): four small models with the published
templates' training settings — a Conformer RNN-T (mean_batch, FastEmit 5e-3), a
FastConformer TDT (mean_volume, sigma 0.02), a hybrid FastConformer TDT-CTC (CTC weight
0.3) and a hybrid RNN-T-CTC whose RNN-T loss is divided by the tokens and CTC loss by the
utterances (NeMo's shipped hybrid reductions) — on the real clips, dropout and BatchNorm
in eval mode and SpecAugment off on both sides. For each: the import maps NeMo's training
settings; the gradient of every parameter after asrkit's loss is NeMo's `training_step`
gradient; one AdamW update is torch's; and
asrkit's update from two micro-batches equals NeMo's on their union, where NeMo's own
accumulation (the mean of the micro-batches' means) does not. Also the hybrid's CTC greedy
text and NeMo's CPU RNN-T loss with FastEmit."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from asrkit.checkpoints import named_variables
from asrkit.decoding.search.front import DecodeOptions, decode_batch
from asrkit.experiment import build_network, load_experiment
from asrkit.importers.nemo_archive import read_nemo
from asrkit.importers.nemo_model import import_nemo
from asrkit.importers.nemo_weights import assign_nemo_transducer
from asrkit.losses import rnnt_loss
from asrkit.training.optimizers import build_optimizer
from asrkit.training.task import TransducerTask
from tests.recording import Recorder

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests/data/nemo"
STEPS = np.load(DATA / "steps.npz")
META = json.loads((DATA / "steps.json").read_text())
KINDS = ("conformer_rnnt", "fastconformer_tdt", "hybrid_tdt_ctc", "hybrid_rnnt_mixed")
LEARNING_RATE = 1e-3  # the fixture's torch AdamW


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = {}
    for name in KINDS:
        exp = tmp_path_factory.mktemp(name) / "exp"
        summary = import_nemo(DATA / f"step_{name}.nemo", exp)
        out[name] = (summary, load_experiment(exp))
    return out


def _batch(name, rows=slice(None)):
    """NeMo's features of the clips ([B, F, T] -> [B, T, F]) and its targets as asrkit ids."""
    features = STEPS["features"][rows].transpose(0, 2, 1)
    lengths = STEPS["feature_lengths"][rows].astype(np.int32)
    targets, target_lengths = STEPS[f"{name}/targets"][rows], STEPS[f"{name}/target_lengths"][rows]
    frames, tokens = int(lengths.max()), int(target_lengths.max())
    valid = np.arange(targets.shape[1])[None] < target_lengths[:, None]
    labels = np.where(valid, targets + 1, 0).astype(np.int32)[:, :tokens]
    return features[:, :frames], lengths, labels, target_lengths.astype(np.int32)


def _as_asrkit(experiment, name, what):
    """NeMo's per-parameter arrays `what` (grad, update, accumulated) in asrkit's layout:
    assigned through the importer's own mapping to a network of the same config."""
    state = dict(read_nemo(DATA / f"step_{name}.nemo").weights)
    state = {k: v for k, v in state.items() if not k.startswith("preprocessor.")}
    prefix = f"{name}/{what}/"
    for key in STEPS.files:
        if key.startswith(prefix):
            state[key[len(prefix) :]] = STEPS[key]
    network = build_network(experiment.config, experiment.network.vocab_size)
    assign_nemo_transducer(network, state)
    return [v.numpy() for v in network.trainable_variables]


def _nemo_owners(experiment, name):
    """For each asrkit trainable variable, the NeMo tensor each element came from: every NeMo
    tensor filled with its number (1, 2, ...) and assigned through the importer's mapping
    (transposes, reorderings and concatenations only, so the numbers arrive intact)."""
    state = dict(read_nemo(DATA / f"step_{name}.nemo").weights)
    keys = sorted(k for k in state if not k.startswith("preprocessor."))
    marked = {k: np.full(state[k].shape, i + 1, np.float32) for i, k in enumerate(keys)}
    network = build_network(experiment.config, experiment.network.vocab_size)
    assign_nemo_transducer(network, marked)
    return keys, [v.numpy() for v in network.trainable_variables]


# What a Conformer block's attention scores are made of (relative positions included)
SCORE_TENSORS = (".self_attn.linear_q.", ".self_attn.linear_k.", ".self_attn.linear_pos.",
                 ".self_attn.pos_bias_u", ".self_attn.pos_bias_v")  # fmt: skip


def _close_per_nemo_tensor(got, want, keys, owners, batch_statistics=False):
    """Each NeMo tensor's gradient (its elements wherever asrkit keeps them: q, k and v in
    one kernel) within 1e-4 of its own norm; every trainable element comes from NeMo. The
    key projection's bias has no gradient in exact arithmetic (a constant added to every
    key leaves each query's softmax as it was): on both sides it must be float noise,
    below 1e-4 of the same layer's query-bias gradient (or 1e-8). So has, under a BatchNorm
    from the batch's statistics (`batch_statistics`), the bias of the convolution before it
    (the batch's mean takes it away again): noise below 1e-2 of its kernel's gradient. Where
    the attention scores barely move the loss (the gradients of what makes them — query,
    key, position projections and biases — below 1e-3 of the value projection's: sums of
    near-cancelling terms), their error is bounded by 1e-4 of the value projection's
    gradient instead of their own."""
    noise = {"self_attn.linear_k.bias": ("linear_k", "linear_q", 1e-4)}
    if batch_statistics:
        noise["conv.depthwise_conv.bias"] = ("bias", "weight", 1e-2)
    assert all((o > 0).all() for o in owners)

    def pair(key):
        where = [o == keys.index(key) + 1 for o in owners]
        return (np.concatenate([x[m] for x, m in zip(got, where, strict=True)]),
                np.concatenate([x[m] for x, m in zip(want, where, strict=True)]))  # fmt: skip

    for key in keys:
        g, w = pair(key)
        if not w.size:
            continue  # a buffer or frozen tensor: not trained
        suffix = next((n for n in noise if key.endswith(n)), None)
        if suffix:
            this, other, bound = noise[suffix]
            scale = np.linalg.norm(pair(key[: -len(suffix)] + suffix.replace(this, other))[1])
            assert max(np.linalg.norm(g), np.linalg.norm(w)) <= bound * scale + 1e-8, key
            continue
        scale = np.linalg.norm(w)
        score = next((n for n in SCORE_TENSORS if n in key), None)
        if score:  # the attention scores' tensors, against the value projection's gradient
            value = np.linalg.norm(pair(key[: key.index(score)] + ".self_attn.linear_v.weight")[1])
            scale = value if scale < 1e-3 * value else scale
        assert np.linalg.norm(g - w) <= 1e-4 * scale + 1e-9, (key, g.size)


def _gradients(experiment, batch):
    network = experiment.network
    task = TransducerTask(network, experiment.config.loss)
    with tf.GradientTape() as tape:
        total, count = task.compute_loss_terms(batch, training=False)
        loss = total / tf.cast(count, tf.float32)
    grads = tape.gradient(loss, network.trainable_variables)
    return float(loss), [tf.convert_to_tensor(g).numpy() for g in grads]


def _close(got, want, network):
    """Each trainable variable's update within 1e-4 of its norm; the attention scores'
    tensors (whose updates can be thousands of times smaller than the layer's value
    projection's, as in `_close_per_nemo_tensor`) within 1e-4 of the value projection's
    where theirs is smaller."""
    what = network.trainable_variables
    index = {id(v): i for i, v in enumerate(what)}
    value_of = {}  # a score tensor's position -> its layer's value projection's update norm
    for block in network.encoder.blocks:
        attention = block.attention
        qkv = want[index[id(attention.qkv.kernel)]]
        value = np.linalg.norm(qkv[:, 2 * qkv.shape[1] // 3 :])
        position = getattr(attention, "position", None)  # relative positions only
        scores = [getattr(attention, "pos_bias_u", None), getattr(attention, "pos_bias_v", None),
                  position.kernel if position is not None else None]  # fmt: skip
        value_of.update({index[id(v)]: value for v in scores if id(v) in index})
    for i, (g, w, v) in enumerate(zip(got, want, what, strict=True)):
        scale = np.linalg.norm(w)
        value = value_of.get(i, 0.0)
        scale = value if scale < 1e-3 * value else scale
        assert np.linalg.norm(g - w) <= 1e-4 * scale + 1e-9, (v.path, np.abs(g - w).max(), scale)


def test_the_import_maps_nemos_training_settings(imported):
    rnnt, tdt, hybrid, mixed = (imported[k][1].config for k in KINDS)
    # each loss divided by its own count: the window's tokens, the window's utterances
    assert (mixed.loss.normalize_by, mixed.loss.ctc_normalize_by) == ("tokens", "utterances")
    assert hybrid.loss.ctc_normalize_by is None
    assert (rnnt.loss.kind, rnnt.loss.normalize_by, rnnt.loss.fastemit_lambda) == (
        "full", "utterances", 5e-3)  # fmt: skip
    assert (tdt.loss.kind, tdt.loss.normalize_by, tdt.loss.sigma) == ("tdt", "tokens", 0.02)
    assert hybrid.model.ctc_head and hybrid.loss.ctc_interpolate
    assert hybrid.loss.ctc_weight == 0.3 and hybrid.loss.normalize_by == "utterances"
    for config in (rnnt, tdt, hybrid):
        enc, data, train = config.model.encoder, config.data, config.train
        assert (enc.dropout, enc.attention_dropout, enc.pre_encoder_dropout) == (0.1, 0.05, None)
        assert config.model.predictor.dropout == 0.2
        assert (data.spec_freq_masks, data.spec_freq_width, data.spec_time_masks,
                data.spec_time_width) == (2, 27, 10, 0.05)  # fmt: skip
        assert (train.adam_beta_1, train.adam_beta_2, train.weight_decay) == (0.9, 0.98, 1e-3)
    notes = " ".join(imported["hybrid_tdt_ctc"][0].plan.notes)
    assert "joint.jointnet.dropout 0.2" in notes and "CTC head" not in notes


@pytest.mark.parametrize("name", KINDS)
def test_every_gradient_is_nemos_training_step_gradient(imported, name):
    _, experiment = imported[name]
    loss, grads = _gradients(experiment, _batch(name))
    assert loss == pytest.approx(META[name]["loss"], rel=1e-5)
    want = _as_asrkit(experiment, name, "grad")
    assert len(grads) == len(want) > 20
    _close_per_nemo_tensor(grads, want, *_nemo_owners(experiment, name))


@pytest.mark.parametrize("name", KINDS)
def test_one_adamw_update_on_those_gradients_is_torchs(imported, name):
    """asrkit's AdamW with the imported settings (NeMo's betas and weight decay), applied to
    NeMo's gradients, moves every weight as torch's AdamW did. (On its own gradients too,
    except where a gradient is rounding noise — e.g. the key projection's bias, which
    softmax ignores — and Adam's first step turns noise into ±lr on either side.)"""
    _, experiment = imported[name]
    network, train = experiment.network, experiment.config.train
    variables = network.trainable_variables
    before = [v.numpy() for v in variables]
    optimizer = build_optimizer(
        "adamw",
        LEARNING_RATE,
        train.weight_decay,
        (train.adam_beta_1, train.adam_beta_2),
        train.adam_epsilon,
    )
    optimizer.apply([tf.constant(g) for g in _as_asrkit(experiment, name, "grad")], variables)
    after = [v.numpy() for v in variables]
    for v, b in zip(variables, before, strict=True):
        v.assign(b)
    want = _as_asrkit(experiment, name, "update")  # torch's after - before, in float32
    for got, b, w, v in zip(after, before, want, variables, strict=True):
        # float32 weights: equal to a unit or two in the last place of the weight
        np.testing.assert_allclose(got, b + w, rtol=3e-7, atol=1e-8, err_msg=v.path)
    moved = max(np.abs(a - b).max() for a, b in zip(after, before, strict=True))
    assert moved == pytest.approx(LEARNING_RATE, rel=0.01)  # Adam's first step: about ±lr


@pytest.mark.parametrize(
    "name",
    [pytest.param("conformer_rnnt", marks=pytest.mark.slow),  # ~3 s each
     pytest.param("fastconformer_tdt", marks=pytest.mark.slow), "hybrid_tdt_ctc",
     "hybrid_rnnt_mixed"],
)  # fmt: skip
def test_two_micro_batches_update_as_nemos_union_not_as_nemos_accumulation(imported, name):
    """The accumulation engine (`fit`, a window of two micro-batches, dropout drawn at the
    imported rates set to 0) applies the gradient of NeMo's training step on their union;
    NeMo's own accumulation (Lightning's mean of the micro-batches' means) is another."""
    _, experiment = imported[name]
    config = experiment.config.model
    still = dataclasses.replace(
        config, encoder=dataclasses.replace(config.encoder, dropout=0.0, attention_dropout=None,
                                            pre_encoder_dropout=None),
        predictor=dataclasses.replace(config.predictor, dropout=0.0),
    )  # fmt: skip
    network = build_network(dataclasses.replace(experiment.config, model=still),
                            experiment.network.vocab_size)  # fmt: skip
    network.set_weights(experiment.network.get_weights())
    task = TransducerTask(network, experiment.config.loss)
    recorder = Recorder(learning_rate=1.0, name="recorder")
    task.compile(recorder, accumulation_steps=2, clip_global_norm=None)
    split = META[name]["split"]
    parts = [_batch(name, rows) for rows in (slice(0, split), slice(split, None))]

    def micro_batches():
        yield from parts

    spec = tuple(tf.TensorSpec([None] * x.ndim, tf.as_dtype(x.dtype)) for x in parts[0])
    task.fit(tf.data.Dataset.from_generator(micro_batches, output_signature=spec), epochs=1,
             verbose=0)  # fmt: skip
    applied = [v.numpy() for v in recorder.seen]
    union = _as_asrkit(experiment, name, "grad")
    _close(applied, union, network)
    accumulated = _as_asrkit(experiment, name, "accumulated")
    differs = [np.linalg.norm(a - u) / max(np.linalg.norm(u), 1e-12)
               for a, u in zip(accumulated, union, strict=True)]  # fmt: skip
    assert max(differs) > 1e-2  # NeMo's own accumulation is not its union's update


def test_ctc_greedy_is_nemos(imported):
    _, experiment = imported["hybrid_tdt_ctc"]
    features, lengths, _, _ = _batch("hybrid_tdt_ctc")
    found = decode_batch(experiment.network, features, lengths, experiment.tokenizer,
                         DecodeOptions("ctc"))  # fmt: skip
    meta = META["hybrid_tdt_ctc"]
    blank = experiment.network.vocab_size - 1  # NeMo's blank id
    for hypothesis, frames, text in zip(found, meta["ctc_frames"], meta["ctc_text"], strict=True):
        # NeMo's best symbol per frame, repeats merged and blanks dropped, as asrkit ids.
        want = [s + 1 for i, s in enumerate(frames)
                if s != blank and (i == 0 or s != frames[i - 1])]  # fmt: skip
        assert hypothesis.tokens == want
        assert hypothesis.text.lower() == text.lower()
    assert sum(len(h.tokens) for h in found) > 20


def test_fastemit_is_nemos_rnnt_loss_and_gradient():
    acts = tf.constant(STEPS["fastemit/acts"])
    # NeMo's blank is the last id; asrkit's loss takes any blank id.
    blank = acts.shape[-1] - 1
    with tf.GradientTape() as tape:
        tape.watch(acts)
        losses = rnnt_loss(acts, STEPS["fastemit/labels"], STEPS["fastemit/act_lens"],
                           STEPS["fastemit/label_lens"], blank=blank,
                           fastemit_lambda=float(STEPS["fastemit/lambda"]))  # fmt: skip
        total = tf.reduce_sum(losses)
    grad = tape.gradient(total, acts).numpy()
    np.testing.assert_allclose(losses.numpy(), STEPS["fastemit/losses"], rtol=1e-5)
    np.testing.assert_allclose(grad, STEPS["fastemit/grad"], atol=1e-5)
    plain = rnnt_loss(acts, STEPS["fastemit/labels"], STEPS["fastemit/act_lens"],
                      STEPS["fastemit/label_lens"], blank=blank)  # fmt: skip
    assert not np.allclose(plain.numpy(), losses.numpy())
    keras.backend.clear_session()


def test_the_commands_decode_with_ctc_and_refuse_it_without_a_head(imported, capsys):
    """`transcribe --method ctc` on the imported hybrid prints the CTC head's search of the
    file; on a model without a CTC head, and with --streaming, one line and exit code 2."""
    from asrkit.audio import read_audio
    from asrkit.cli.main import main
    from asrkit.features import log_mel

    clip = str(ROOT / META["clips"][0])
    hybrid, plain = (str(imported[k][0].exp_dir) for k in ("hybrid_tdt_ctc", "conformer_rnnt"))
    assert main(["transcribe", "--exp-dir", hybrid, "--method", "ctc", clip]) == 0
    printed = capsys.readouterr().out
    experiment = imported["hybrid_tdt_ctc"][1]
    features = log_mel(read_audio(clip, 16000), experiment.config.features).numpy()[None]
    (found,) = decode_batch(experiment.network, features, [features.shape[1]],
                            experiment.tokenizer, DecodeOptions("ctc"))  # fmt: skip
    assert len(found.text) > 10 and found.text in printed
    for argv, says in (
        (["transcribe", "--exp-dir", plain, "--method", "ctc", clip], "has no CTC head"),
        (["transcribe", "--exp-dir", hybrid, "--method", "ctc", "--streaming", clip],
         "--streaming decodes the transducer"),
    ):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err


def test_settings_the_import_maps_or_lists_by_key():
    """Stochastic depth is mapped; a CTC reduction other than the transducer's is mapped to
    its own count (`loss.ctc_normalize_by`), one asrkit has none of is listed; a setting that
    changes the network's output is refused naming the key."""
    from asrkit.importers.nemo_model import UnsupportedNemoModel, plan_import

    nemo = read_nemo(DATA / "step_hybrid_tdt_ctc.nemo").config
    nemo = json.loads(json.dumps(nemo))
    nemo["encoder"].update(stochastic_depth_drop_prob=0.2, stochastic_depth_mode="uniform")
    nemo["aux_ctc"]["ctc_reduction"] = "mean_volume"
    plan = plan_import(nemo, "m.nemo")
    enc = plan.config.model.encoder
    assert (enc.stochastic_depth, enc.stochastic_depth_mode, enc.stochastic_depth_start) == (
        0.2, "uniform", 1)  # fmt: skip
    assert plan.config.loss.normalize_by == "utterances"  # rnnt_reduction mean_batch
    assert plan.config.loss.ctc_normalize_by == "tokens"
    assert not any("ctc_reduction" in n for n in plan.notes)
    nemo["aux_ctc"]["ctc_reduction"] = "sum"
    plan = plan_import(nemo, "m.nemo")
    assert plan.config.loss.ctc_normalize_by is None
    assert any(n.startswith("aux_ctc.ctc_reduction 'sum'") for n in plan.notes)
    nemo["joint"]["jointnet"]["activation"] = "sigmoid"  # changes the output: refused
    with pytest.raises(UnsupportedNemoModel, match=r"joint\.jointnet\.activation: 'sigmoid'"):
        plan_import(nemo, "m.nemo")


def test_training_only_settings_import_with_a_note_and_training_names_the_way_out(tmp_path):
    """Settings that only matter in training (a loss divided by no count, another loss'
    name, another SpecAugment, sampled predictor states) do not stop a model from decoding:
    the network is the one imported without them, each is noted by key, and training
    refuses what it cannot model in one line naming the setting that fixes it."""
    from asrkit.config import ConfigError
    from asrkit.importers.nemo_model import plan_import
    from asrkit.training.setup import build_task
    from asrkit.training.trainer import train

    nemo = json.loads(json.dumps(read_nemo(DATA / "step_conformer_rnnt.nemo").config))
    plain = plan_import(nemo, "m.nemo")
    nemo["rnnt_reduction"] = "sum"
    nemo["loss"] = {**(nemo.get("loss") or {}), "loss_name": "graph_rnnt"}
    nemo["spec_augment"] = {"_target_": "x.SpecCutoutOnly", "rect_masks": 5}
    nemo["decoder"]["random_state_sampling"] = True
    plan = plan_import(nemo, "m.nemo")
    assert plan.config.model == plain.config.model and plan.config.features == (
        plain.config.features
    )
    for key in ("rnnt_reduction 'sum'", "loss.loss_name 'graph_rnnt'",
                "spec_augment 'x.SpecCutoutOnly'", "decoder.random_state_sampling"):  # fmt: skip
        assert sum(note.startswith(key) for note in plan.notes) == 1, (key, plan.notes)
    assert plan.config.loss.normalize_by == "none" and not plan.config.data.spec_augment
    with pytest.raises(ConfigError, match=r"--set loss\.normalize_by=tokens"):
        build_task(plan.config, 10, steps=1)
    with pytest.raises(ConfigError, match="rnnt_reduction: sum"):
        train(plan.config, tmp_path / "exp")
    assert not (tmp_path / "exp").exists()  # refused before anything was written


@pytest.mark.slow  # ~15 s: a SavedModel written and loaded
def test_the_export_decodes_with_the_ctc_head(imported, tmp_path):
    """`export --method ctc`: the SavedModel's serve_batch gives the CTC head's search."""
    from asrkit.audio import read_audio
    from asrkit.export import export_model
    from asrkit.features import log_mel

    summary, experiment = imported["hybrid_tdt_ctc"]
    export_model(summary.exp_dir, tmp_path / "export", options=DecodeOptions("ctc"))
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    clips = [read_audio(ROOT / c, 16000) for c in META["clips"][:2]]
    lengths = np.array([len(c) for c in clips], np.int32)
    waves = np.zeros((2, lengths.max()), np.float32)
    for i, c in enumerate(clips):
        waves[i, : len(c)] = c
    out = loaded.signatures["serve_batch"](waveforms=tf.constant(waves),
                                           lengths=tf.constant(lengths))  # fmt: skip
    for i, clip in enumerate(clips):
        features = log_mel(clip, experiment.config.features).numpy()[None]
        (want,) = decode_batch(experiment.network, features, [features.shape[1]],
                               experiment.tokenizer, DecodeOptions("ctc"))  # fmt: skip
        assert out["text"][i].numpy().decode() == want.text
        assert len(want.text) > 10


def test_transcribe_takes_a_nemo_manifest_with_segments(imported, tmp_path, capsys):
    """`transcribe --manifest` reads NeMo's entries (a segment of a clip by offset, a whole
    clip by a path relative to the manifest) and names each result by its id."""
    import soundfile

    from asrkit.audio import read_audio
    from asrkit.cli.main import main
    from asrkit.features import log_mel

    clip = ROOT / META["clips"][1]
    (tmp_path / "audio").mkdir()
    (tmp_path / "audio" / "whole.flac").write_bytes(clip.read_bytes())
    lines = [{"audio_filepath": str(clip), "offset": 1.0, "duration": 2.5, "text": "-"},
             {"audio_filepath": "audio/whole.flac", "duration": soundfile.info(clip).duration,
              "text": "-"}]  # fmt: skip
    (tmp_path / "m.json").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary, experiment = imported["hybrid_tdt_ctc"]
    argv = ["transcribe", "--exp-dir", str(summary.exp_dir), "--method", "ctc",
            "--manifest", str(tmp_path / "m.json")]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    samples = read_audio(clip, 16000)
    for line, piece in zip(printed, (samples[16000:56000], samples), strict=True):
        features = log_mel(piece, experiment.config.features).numpy()[None]
        (want,) = decode_batch(experiment.network, features, [features.shape[1]],
                               experiment.tokenizer, DecodeOptions("ctc"))  # fmt: skip
        assert line.split("\t")[1] == want.text
    assert [line.split("\t")[0] for line in printed] == [f"{clip.stem}-1.00", "whole"]
    assert main(["transcribe", "--exp-dir", str(summary.exp_dir), "--manifest",
                 str(tmp_path / "m.json"), str(clip)]) == 2  # fmt: skip


def test_batch_norm_from_the_batch_is_nemos_default_fine_tuning_step(imported):
    """`model.encoder.conv_norm: batch` (NeMo's default fine-tuning: BatchNorm in train mode)
    on the imported model, dropout off: its gradient is NeMo's training_step gradient with
    every BatchNorm from the batch's statistics (`batch_norm.npz`), which is not the frozen
    one's; the running statistics move as torch's (Keras' momentum = 1 - torch's; torch
    stores the unbiased variance, n / (n - 1) of the batch's, n the frames counted)."""
    name = "conformer_rnnt"
    _, experiment = imported[name]
    reference = np.load(DATA / "batch_norm.npz")
    momentum = float(reference["momentum/encoder.layers.0.conv.batch_norm"])
    config = experiment.config
    encoder = dataclasses.replace(
        config.model.encoder, conv_norm="batch", batch_norm_momentum=1.0 - momentum,
        dropout=0.0, attention_dropout=0.0, pre_encoder_dropout=0.0,
    )  # fmt: skip
    model = dataclasses.replace(
        config.model, encoder=encoder,
        predictor=dataclasses.replace(config.model.predictor, dropout=0.0),
    )  # fmt: skip
    network = build_network(dataclasses.replace(config, model=model), experiment.network.vocab_size)
    weights = named_variables(experiment.network)
    for key, variable in named_variables(network).items():
        variable.assign(weights[key])
    norm = network.encoder.blocks[0].conv.norm
    frozen_mean = norm.moving_mean.numpy().copy()
    task = TransducerTask(network, config.loss)
    # Every frame NeMo's batch has: its features run a frame past the longest clip, and a
    # BatchNorm from the batch counts that padding too.
    _, lengths, labels, label_lengths = _batch(name)
    batch = (STEPS["features"].transpose(0, 2, 1), lengths, labels, label_lengths)
    with tf.GradientTape() as tape:
        total, count = task.compute_loss_terms(batch, training=True)
        loss = total / tf.cast(count, tf.float32)
    grads = [tf.convert_to_tensor(g).numpy()
             for g in tape.gradient(loss, network.trainable_variables)]  # fmt: skip
    assert float(loss) == pytest.approx(float(reference["loss"]), rel=1e-5)
    assert float(loss) != pytest.approx(META[name]["loss"], rel=1e-3)  # frozen statistics' loss
    state = dict(read_nemo(DATA / f"step_{name}.nemo").weights)
    state = {k: v for k, v in state.items() if not k.startswith("preprocessor.")}
    state.update({k[len("grad/") :]: reference[k] for k in reference.files
                  if k.startswith("grad/")})  # fmt: skip
    want_network = build_network(config, experiment.network.vocab_size)
    assign_nemo_transducer(want_network, state)
    want = [v.numpy() for v in want_network.trainable_variables]
    _close_per_nemo_tensor(grads, want, *_nemo_owners(experiment, name), batch_statistics=True)
    nemo_mean = reference["running_mean/encoder.layers.0.conv.batch_norm"]
    assert not np.allclose(nemo_mean, frozen_mean)
    np.testing.assert_allclose(norm.moving_mean.numpy(), nemo_mean, rtol=1e-5, atol=1e-6)
