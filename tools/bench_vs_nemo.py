"""asrkit beside NeMo on the same network and data: decoding, the RNN-T loss, a training step.

NeMo runs in its own venv (asrkit never imports torch or NeMo): the NeMo side of every
measurement runs in a child process under `--nemo-python`, the asrkit side in a child under
this Python (harness.py: one environment, the BFC allocator on). The network is one NeMo
Conformer-Transducer (`--nemo-model`, e.g. tools/train_nemo_reference.py's model.nemo),
imported into asrkit with `asrkit import nemo`, so both sides run the same weights.

    python tools/bench_vs_nemo.py --nemo-python /path/nemo-venv/bin/python \
        --nemo-model exp/nemo_ref/model.nemo --manifest exp/mini/data/test-clean.jsonl \
        [--repeats 3] [--utterances 64]
    python tools/bench_vs_nemo.py --nemo-python ... --nemo-model fc_114m.nemo \
        --tasks step --shapes 2x10x40,4x20x80
    python tools/bench_vs_nemo.py --nemo-python ... --nemo-model fc_114m.nemo \
        --tasks fit --shapes 1x10x40 --cap 6GiB

Each figure is measured in fresh processes, alternating (asrkit, NeMo, asrkit, NeMo ...),
`--repeats` times, after a warm-up in the same process; printed as asrkit and NeMo median
(min-max) and the ratio asrkit / NeMo of the medians:
- greedy decoding RTF (features, encoder and search; wall time / audio), one utterance per
  call and 16 per call: NeMo's greedy_batch (label-looping) vs asrkit's greedy search, then
  each of the three stages timed alone on the same batches (their sum is near the whole),
  and the tokens the search emitted per second of speech (a random model emits on most
  frames, so measure on one whose emissions are a trained model's: make_nemo_published.py
  `--emit-like`); with `--bfloat16` also each side in bfloat16 (asrkit's encoder run in
  it, `--precision bfloat16`; NeMo under PyTorch's CPU autocast);
- the RNN-T loss alone, forward + backward on random logits, at three shapes: NeMo's
  RNNTLoss (numba on the CPU) vs asrkit's `rnnt_loss`;
- one training update of the whole network from features (16 utterances of the manifest,
  AdamW, no augmentation): NeMo's modules with its RNNTLoss, and again with the vectorised
  PyTorch loss of make_nemo_fixtures.py (so that the loss's share shows), vs asrkit's
  TransducerTask with the imported experiment's loss settings, and (if those fuse the joint
  and the loss) again with `loss.fused: false`;
- the peak RSS of each child process;
- `step` (not by default; no manifest): one training update of a `.nemo` of any size
  (tools/make_nemo_published.py builds the published shapes) on fabricated micro-batches
  (`--shapes`: utterances x seconds x labels; random features and labels), dropout off (`--dropout
  config`: the encoder's and predictor's rates as the config sets them; the joint's off, asrkit's
  has none), BatchNorm at its statistics: NeMo's own update as the model's config sets it (with
  `fuse_loss_wer`, its sub-batched joint and loss) with its CPU loss (numba: the memory figure)
  and with the vectorised loss in its place (the time figure), against asrkit's TransducerTask
  with the imported loss settings. Per side: RSS after loading, RSS with the training state (after
  NeMo's first update: its AdamW slots exist only from then), the time per update (asrkit's inside
  a `fit` epoch: harness.update_times) and of the encoder's forward and backward alone (the
  rest of the update is the difference), the process peak, and the tensors' bytes before the step
  and their peak during it (what a GPU would hold): asrkit's from its allocator, NeMo's counted op
  by op as PyTorch makes and frees them (a dispatch mode, in one more update after the timed
  ones). asrkit runs twice: in the measuring environment (oneDNN off: exact allocator peaks) and
  as its commands run (`AS_COMMANDS_RUN`, oneDNN on: the time users get; oneDNN's scratch is then
  outside the allocator's figures). With `--bfloat16` also both in bfloat16 mixed precision
  (asrkit's `train.precision: mixed_bfloat16`, NeMo's forward under PyTorch's CPU autocast).
- `boost` (not by default; `--boost FILE`): greedy decoding with word boosting, each side's
  own (NeMo's boosting tree, `greedy.boosting_tree` with `context_score` = `--boost-weight`,
  depth scaling 1, no Triton; asrkit's `--boost` tables at that weight): the search alone,
  one utterance per call and 16 per call, without and with the phrases, and how many
  utterances' text the phrases changed. The two score a match differently (NeMo adds
  log(depth) per piece and keeps what a finished phrase earned on leaving it; asrkit gives
  back only abandoned matches), so their texts are not compared token for token.
- `fit` (not by default): the most utterances of the first `--shapes`' length and labels
  each side fits in one update under a process memory cap (`--cap`, e.g. 6GiB): the peak
  RSS of a child per count tried, doubling from 1, then halving the gap; asrkit as its
  commands run, NeMo with its own loss.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import (  # noqa: E402
    AS_COMMANDS_RUN,
    child_request,
    reply,
    run_child,
    spread,
    timed,
    update_times,
)  # fmt: skip

LOSS_SHAPES = ((4, 100, 20, 65), (8, 150, 30, 65), (2, 200, 40, 129))  # B, T, U, V (blank incl.)
TRAIN_BATCH = 16
ROUNDS = 3  # timed calls per process after the warm-up (median)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _utterances(manifest: str, limit: int) -> list[dict]:
    lines = Path(manifest).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()][:limit]


def _waves(utterances):
    import soundfile

    return [soundfile.read(u["audio_path"], dtype="float32")[0] for u in utterances]


def _median_time(fn) -> float:
    return timed(fn, repeats=ROUNDS).median


# ---- the asrkit side -------------------------------------------------------------------


def _asrkit(request: dict) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    from asrkit.data.pipeline import without_autotuning
    from asrkit.experiment import load_experiment

    # imported once, by the parent: not in this process' peak, removed after the comparisons
    if request["task"] == "step":
        return _asrkit_step(Path(request["exp"]), request)
    experiment = load_experiment(request["exp"], precision=request.get("precision", "float32"))
    utterances = _utterances(request["manifest"], request["utterances"])
    waves = _waves(utterances)
    out = {}
    if request["task"] == "decode":
        from asrkit.decoding.recogniser import WAVEFORMS_SPECS, Recogniser
        from asrkit.decoding.runner import padded_waveforms
        from asrkit.decoding.search.front import DecodeOptions, search

        config, network = experiment.config, experiment.network
        options = DecodeOptions(max_symbols_per_step=config.decode.max_symbols_per_step)
        recogniser = Recogniser.of(experiment, options)
        featurise = tf.function(
            recogniser.featurise, input_signature=WAVEFORMS_SPECS, autograph=False
        )
        encode = tf.function(lambda f, n: network.encode(f, n, training=False),
                             reduce_retracing=True, autograph=False)  # fmt: skip
        find = tf.function(lambda e, n: search(network, e, n, options),
                           reduce_retracing=True, autograph=False)  # fmt: skip
        seconds = sum(len(w) for w in waves) / 16000
        for per_call in (1, 16):
            groups = [waves[i : i + per_call] for i in range(0, len(waves), per_call)]

            def whole(groups=groups):
                for group in groups:  # the path of asrkit decode
                    recogniser.find_waveforms(*padded_waveforms(group)).scores.numpy()

            out[f"greedy RTF, {per_call} per call"] = _median_time(whole) / seconds
            emitted = sum(int(tf.reduce_sum(recogniser.find_waveforms(
                *padded_waveforms(g)).counts[:, 0])) for g in groups)  # fmt: skip
            out[f"tokens per second of speech, {per_call} per call"] = emitted / seconds
            batches = [featurise(*padded_waveforms(g)) for g in groups]
            encoded = [encode(*b) for b in batches]
            stages = {
                "features": lambda groups=groups: [
                    featurise(*padded_waveforms(g))[0].numpy() for g in groups
                ],
                "encoder": lambda batches=batches: [encode(*b)[0].numpy() for b in batches],
                "search": lambda encoded=encoded: [find(e, n).scores.numpy() for e, n in encoded],
            }
            for stage, fn in stages.items():
                out[f"  {stage} RTF, {per_call} per call"] = _median_time(fn) / seconds
    elif request["task"] == "boost":
        from asrkit.decoding.fusion.boosting import Phrase, boost_tables, phrase_sequences
        from asrkit.decoding.fusion.steps import as_tensors
        from asrkit.decoding.fusion.tables import combine
        from asrkit.decoding.recogniser import WAVEFORMS_SPECS, Recogniser
        from asrkit.decoding.runner import padded_waveforms
        from asrkit.decoding.search.front import DecodeOptions, search

        config, network = experiment.config, experiment.network
        options = DecodeOptions(max_symbols_per_step=config.decode.max_symbols_per_step)
        featurise = tf.function(Recogniser.of(experiment, options).featurise,
                                input_signature=WAVEFORMS_SPECS, autograph=False)  # fmt: skip
        phrases = [Phrase(p, request["boost_weight"]) for p in request["boost"]]
        tables = as_tensors(combine(boost_tables(
            phrase_sequences(phrases, experiment.tokenizer), network.vocab_size
        )))  # fmt: skip
        encode = tf.function(lambda f, n: network.encode(f, n, training=False),
                             reduce_retracing=True, autograph=False)  # fmt: skip
        find = tf.function(lambda e, n, b=None: search(network, e, n, options, b),
                           reduce_retracing=True, autograph=False)  # fmt: skip
        seconds = sum(len(w) for w in waves) / 16000
        for per_call in (1, 16):
            groups = [waves[i : i + per_call] for i in range(0, len(waves), per_call)]
            batches = [featurise(*padded_waveforms(g)) for g in groups]
            encoded = [encode(*b) for b in batches]
            texts = {}
            for label, boost in (("plain", None), ("boosted", tables)):

                def run(encoded=encoded, boost=boost):
                    return [find(e, n, boost) for e, n in encoded]

                out[f"search RTF {label}, {per_call} per call"] = _median_time(run) / seconds
                texts[label] = [f.tokens[i, 0, : f.counts[i, 0]].numpy().tolist()
                                for f in run() for i in range(f.counts.shape[0])]  # fmt: skip
            out[f"utterances changed, {per_call} per call"] = sum(
                a != b for a, b in zip(texts["plain"], texts["boosted"], strict=True)
            )
    elif request["task"] == "loss":
        from asrkit.losses import rnnt_loss

        for b, t, u, v in LOSS_SHAPES:
            rng = np.random.default_rng(0)
            logits = tf.Variable(rng.standard_normal((b, t, u + 1, v)).astype(np.float32))
            labels = tf.constant(rng.integers(1, v, (b, u)), tf.int32)
            t_len, u_len = tf.fill([b], t), tf.fill([b], u)

            @tf.function(autograph=False)
            def step(logits=logits, labels=labels, t_len=t_len, u_len=u_len):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(rnnt_loss(logits, labels, t_len, u_len))
                return tape.gradient(loss, logits)

            out[f"loss fwd+bwd s, {b}x{t}x{u}x{v}"] = _median_time(lambda step=step: step().numpy())
    elif request["task"] == "train":
        import keras

        from asrkit.features import log_mel
        from asrkit.training.task import TransducerTask

        feats = [log_mel(w, experiment.config.features).numpy() for w in waves[:TRAIN_BATCH]]
        labels = [experiment.tokenizer.encode(u["text"]) for u in utterances[:TRAIN_BATCH]]
        lengths = np.array([len(f) for f in feats], np.int32)
        label_lengths = np.array([len(x) for x in labels], np.int32)
        features = np.zeros((len(feats), lengths.max(), feats[0].shape[1]), np.float32)
        targets = np.zeros((len(labels), label_lengths.max()), np.int32)
        for j, (f, x) in enumerate(zip(feats, labels, strict=True)):
            features[j, : len(f)], targets[j, : len(x)] = f, x
        batch = (features, lengths, targets, label_lengths)
        data = without_autotuning(tf.data.Dataset.from_tensors(batch))
        seconds = sum(len(w) for w in waves[:TRAIN_BATCH]) / 16000
        loss = experiment.config.loss
        for name, settings in (("", loss), (", plain joint + loss", replace(loss, fused=False))):
            if name and not loss.fused:
                continue
            task = TransducerTask(experiment.network, settings)
            task.compile(keras.optimizers.AdamW(1e-5), accumulation_steps=1)
            task.build_engine(batch)
            step = update_times(task, data, ROUNDS).median
            out[f"training update s{name}"] = step
            out[f"training audio s/s{name}"] = seconds / step
            out.setdefault("peak RSS MiB", _peak_rss_mib())  # of the imported settings
    out.setdefault("peak RSS MiB", _peak_rss_mib())
    return out


def _shape(request: dict) -> tuple[int, int, int]:
    """(utterances, feature frames, labels) of the step's fabricated micro-batch."""
    return request["batch"], int(request["seconds"] * 100), request["labels"]


def _asrkit_step(exp: Path, request: dict) -> dict:
    """One training update of the imported network on a fabricated micro-batch (random
    features and labels), dropout off unless `request["dropout"]` is "config", as `asrkit
    train` runs it: the process's RSS after loading and after building the engine
    (weights, AdamW slots, accumulators), the allocator's state before the step and its
    peak during it, the time per update and the process peak."""
    import numpy as np
    import tensorflow as tf

    from asrkit.config import AdaptersConfig, load_config
    from asrkit.data.pipeline import without_autotuning
    from asrkit.experiment import build_network
    from asrkit.training.adapting import apply_adapters
    from asrkit.training.memory_meter import allocator_peak
    from asrkit.training.optimizers import build_optimizer
    from asrkit.training.task import TransducerTask

    out = {"RSS after loading MiB": _rss_mib()}
    config = load_config(exp / "config.yaml")
    if request.get("precision") == "bfloat16":  # as train.precision mixed_bfloat16 runs
        import keras

        keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    model = config.model
    if request.get("dropout", "off") == "off":
        encoder = replace(model.encoder, dropout=0.0, attention_dropout=0.0,
                          pre_encoder_dropout=0.0)  # fmt: skip
        predictor = replace(model.predictor, dropout=0.0)
        model = replace(model, encoder=encoder, predictor=predictor)
    vocab = _vocab(exp)
    batch_size, frames, labels = _shape(request)
    rng = np.random.default_rng(0)
    batch = (
        rng.standard_normal((batch_size, frames, config.features.num_mel_bins)).astype("float32"),
        np.full(batch_size, frames, np.int32),
        rng.integers(1, vocab, (batch_size, labels)).astype(np.int32),
        np.full(batch_size, labels, np.int32),
    )
    if request.get("adapters"):
        model = replace(model, adapters=AdaptersConfig(kind="linear", dim=request["adapters"]))
    config = replace(config, model=model)
    loss = config.loss if request.get("loss_fused", True) else replace(config.loss, fused=False)
    network = build_network(config, vocab)
    apply_adapters(network, config)  # the adapters train, all else frozen (none: a no-op)
    task = TransducerTask(network, loss)
    # asrkit's AdamW (torch's update, one fused kernel per weight) at torch's defaults
    task.compile(build_optimizer("adamw", 1e-5, 0.01), accumulation_steps=1)
    task.build_engine(batch)
    out["RSS with the training state MiB"] = _rss_mib()
    out["allocator before the step MiB"] = (
        tf.config.experimental.get_memory_info("CPU:0")["current"] / 2**20
    )
    data = without_autotuning(tf.data.Dataset.from_tensors(batch))
    task.fit(data, verbose=0)  # the warm-up: tracing
    if request.get("peak_only"):  # `fit`: one more update, then only the process peak
        task.fit(data, verbose=0)
        return {"peak RSS MiB": _peak_rss_mib()}
    out["allocator step peak MiB"] = allocator_peak(lambda: task.fit(data, verbose=0)) / 2**20
    # the training state and the step's tensors together: what a GPU would hold
    out["tensor peak MiB"] = out["allocator before the step MiB"] + out["allocator step peak MiB"]
    out["update s"] = update_times(task, data, ROUNDS, warmup=0).median  # traced above
    out["peak RSS MiB"] = _peak_rss_mib()
    out["peak RSS above loading MiB"] = out["peak RSS MiB"] - out["RSS after loading MiB"]
    # the encoder alone, forward and backward (the gradient of its output's sum), so that
    # the update's time splits into the encoder and the rest on both sides
    features, lengths = tf.constant(batch[0]), tf.constant(batch[1])
    weights = task.network.encoder.trainable_variables

    @tf.function(autograph=False)
    def encoder_pass():
        with tf.GradientTape() as tape:
            encoded, _ = task.network.encode(features, lengths, training=True)
            total = tf.reduce_sum(tf.cast(encoded, tf.float32))
        return tape.gradient(total, weights)

    out["encoder fwd+bwd s"] = timed(lambda: encoder_pass()[0].numpy(), repeats=ROUNDS).median
    out["rest of the update s"] = out["update s"] - out["encoder fwd+bwd s"]
    return out


def _vocab(exp: Path) -> int:
    from asrkit.tokenizer import Tokenizer

    return Tokenizer.load(exp / "tokenizer").vocab_size


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---- the NeMo side ----------------------------------------------------------------------


def _nemo(request: dict) -> dict:
    import logging

    logging.disable(logging.WARNING)
    import numpy as np
    import torch
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from nemo.utils import logging as nemo_logging

    nemo_logging.setLevel(logging.ERROR)
    if request.get("adapters"):
        model = _nemo_with_adapters(request["nemo_model"], request["adapters"])
    else:
        model = EncDecRNNTBPEModel.restore_from(request["nemo_model"], map_location="cpu")
    if request["task"] == "step":
        return _nemo_step(model, request)
    utterances = _utterances(request["manifest"], request["utterances"])
    waves = _waves(utterances)
    out = {}

    def padded(ws):
        lengths = torch.tensor([len(w) for w in ws])
        batch = torch.zeros(len(ws), int(lengths.max()))
        for j, w in enumerate(ws):
            batch[j, : len(w)] = torch.from_numpy(w)
        return batch, lengths

    if request["task"] == "decode":
        model.eval()
        seconds = sum(len(w) for w in waves) / 16000
        for per_call in (1, 16):
            groups = [padded(waves[i : i + per_call]) for i in range(0, len(waves), per_call)]

            def features(groups=groups):
                return [model.preprocessor(input_signal=x, length=n) for x, n in groups]

            def encoder(feats):
                return [model.encoder(audio_signal=f, length=n) for f, n in feats]

            def search(encoded):
                for e, n in encoded:
                    model.decoding.rnnt_decoder_predictions_tensor(
                        encoder_output=e, encoded_lengths=n
                    )

            with torch.inference_mode(), _autocast(torch, request.get("precision")):
                whole = _median_time(lambda features=features: search(encoder(features())))
                out[f"greedy RTF, {per_call} per call"] = whole / seconds
                emitted = sum(
                    len(h.y_sequence) for e, n in encoder(features())
                    for h in model.decoding.rnnt_decoder_predictions_tensor(
                        encoder_output=e, encoded_lengths=n)
                )  # fmt: skip
                out[f"tokens per second of speech, {per_call} per call"] = emitted / seconds
                feats = features()
                encoded = encoder(feats)
                stages = {"features": features, "encoder": lambda feats=feats: encoder(feats),
                          "search": lambda encoded=encoded: search(encoded)}  # fmt: skip
                for stage, fn in stages.items():
                    out[f"  {stage} RTF, {per_call} per call"] = _median_time(fn) / seconds
    elif request["task"] == "boost":
        from omegaconf import open_dict

        model.eval()
        seconds = sum(len(w) for w in waves) / 16000
        plain_cfg = model.cfg.decoding
        boosted_cfg = plain_cfg.copy()
        with open_dict(boosted_cfg):
            boosted_cfg.strategy = "greedy_batch"
            boosted_cfg.greedy.boosting_tree = {
                "key_phrases_list": request["boost"], "context_score": request["boost_weight"],
                "depth_scaling": 1.0, "use_triton": False,
            }  # fmt: skip
            boosted_cfg.greedy.boosting_tree_alpha = 1.0
        for per_call in (1, 16):
            groups = [padded(waves[i : i + per_call]) for i in range(0, len(waves), per_call)]
            texts = {}
            with torch.inference_mode():
                encoded = [model.encoder(audio_signal=f, length=n)
                           for f, n in (model.preprocessor(input_signal=x, length=n)
                                        for x, n in groups)]  # fmt: skip
                for label, cfg in (("plain", plain_cfg), ("boosted", boosted_cfg)):
                    model.change_decoding_strategy(cfg, verbose=False)

                    def run(encoded=encoded):
                        return [h for e, n in encoded for h in
                                model.decoding.rnnt_decoder_predictions_tensor(
                                    encoder_output=e, encoded_lengths=n)]  # fmt: skip

                    out[f"search RTF {label}, {per_call} per call"] = _median_time(run) / seconds
                    texts[label] = [list(map(int, h.y_sequence)) for h in run()]
            out[f"utterances changed, {per_call} per call"] = sum(
                a != b for a, b in zip(texts["plain"], texts["boosted"], strict=True)
            )
    elif request["task"] == "loss":
        from nemo.collections.asr.losses.rnnt import RNNTLoss

        for b, t, u, v in LOSS_SHAPES:
            rng = np.random.default_rng(0)
            logits = torch.tensor(rng.standard_normal((b, t, u + 1, v)), dtype=torch.float32,
                                  requires_grad=True)  # fmt: skip
            labels = torch.tensor(rng.integers(0, v - 1, (b, u)))  # NeMo: blank last
            t_len, u_len = torch.full([b], t), torch.full([b], u)
            loss_fn = RNNTLoss(num_classes=v - 1, reduction="sum")

            def step(logits=logits, labels=labels, t_len=t_len, u_len=u_len, loss_fn=loss_fn):
                logits.grad = None
                loss_fn(log_probs=logits, targets=labels, input_lengths=t_len,
                        target_lengths=u_len).backward()  # fmt: skip

            out[f"loss fwd+bwd s, {b}x{t}x{u}x{v}"] = _median_time(step)
    elif request["task"] == "train":
        sys.path.insert(0, str(HERE))
        from make_nemo_fixtures import rnnt_loss

        chosen = utterances[:TRAIN_BATCH]
        signal, lengths = padded(waves[:TRAIN_BATCH])
        model.eval()
        with torch.no_grad():  # features outside the step, as asrkit's are
            feats, feat_lengths = model.preprocessor(input_signal=signal, length=lengths)
        tokens = [model.tokenizer.text_to_ids(u["text"].lower()) for u in chosen]
        u_len = torch.tensor([len(x) for x in tokens])
        targets = torch.zeros(len(tokens), int(u_len.max()), dtype=torch.long)
        for j, x in enumerate(tokens):
            targets[j, : len(x)] = torch.tensor(x)
        model.train()
        for module in model.modules():  # no dropout, as asrkit's imported model has none
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        seconds = float(lengths.sum()) / 16000

        def step(vectorised: bool):
            optimizer.zero_grad()
            encoded, encoded_lengths = model.encoder(audio_signal=feats, length=feat_lengths)
            predicted, _, _ = model.decoder(targets=targets, target_length=u_len)
            joint = model.joint.joint(encoded.transpose(1, 2), predicted.transpose(1, 2))
            if vectorised:
                loss = rnnt_loss(joint, targets, encoded_lengths, u_len).mean()
            else:
                loss = model.loss(log_probs=joint, targets=targets, input_lengths=encoded_lengths,
                                  target_lengths=u_len).mean()  # fmt: skip
            loss.backward()
            optimizer.step()

        for name, vectorised in (("", False), (", vectorised loss", True)):
            seconds_per = _median_time(lambda v=vectorised: step(v))
            out[f"training update s{name}"] = seconds_per
            out[f"training audio s/s{name}"] = seconds / seconds_per
    out["peak RSS MiB"] = _peak_rss_mib()
    return out


def _autocast(torch, precision: str | None):
    """NeMo in bfloat16 as PyTorch offers it on a CPU: autocast (its matrix products and
    convolutions in bfloat16, weights float32, norms and softmax float32)."""
    if precision == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def _nemo_with_adapters(path: str, dim: int):
    """The model with NeMo's LinearAdapter of `dim` units on its encoder (every block, as
    NeMo's adapter tutorial adds it), enabled, and everything else frozen."""
    from make_nemo_fixtures import restore_with_adapter_encoder
    from nemo.collections.common.parts.adapter_modules import LinearAdapterConfig

    model = restore_with_adapter_encoder(path)
    d_model = model.cfg.encoder.d_model
    model.add_adapter(name="encoder:ft", cfg=LinearAdapterConfig(in_features=d_model, dim=dim))
    model.set_enabled_adapters(name="encoder:ft", enabled=True)
    model.freeze()
    model.unfreeze_enabled_adapters()
    return model


def _nemo_step(model, request: dict) -> dict:
    """NeMo's own training update on a fabricated micro-batch, dropout off (or, with
    `request["dropout"]` "config", as the config sets it but in the joint) and BatchNorm at
    its statistics (as asrkit fine-tunes): encoder, predictor and the joint as the model's
    config sets it (with `fuse_loss_wer`: sub-batches of `fused_batch_size`, each joined and
    scored by the model's loss), AdamW. `request["loss"]`: "nemo" (its numba loss on the
    CPU: the memory figure) or "vectorised" (the PyTorch loss of make_nemo_fixtures.py in
    its place: the time figure)."""
    import torch

    out = {"RSS after loading MiB": _rss_mib()}
    if request.get("loss") == "vectorised":
        sys.path.insert(0, str(HERE))
        from make_nemo_fixtures import rnnt_loss

        class Vectorised(torch.nn.Module):
            reduction = None

            def forward(self, acts, labels, act_lens, label_lens):
                return rnnt_loss(acts, labels, act_lens, label_lens)

        model.loss._loss = Vectorised()
    model.train()
    # asrkit's joint has no dropout (the import says so): NeMo's is off on both settings
    joint_dropout = {id(m) for m in model.joint.modules() if isinstance(m, torch.nn.Dropout)}
    dropout_off = request.get("dropout", "off") == "off"
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm1d) or (
            isinstance(module, torch.nn.Dropout) and (dropout_off or id(module) in joint_dropout)
        ):
            module.eval()
    batch_size, frames, labels = _shape(request)
    vocab = model.tokenizer.vocab_size
    generator = torch.Generator().manual_seed(0)
    feats = torch.randn(batch_size, model.cfg.preprocessor.features, frames,
                        generator=generator)  # fmt: skip
    feat_lengths = torch.full([batch_size], frames)
    targets = torch.randint(0, vocab, (batch_size, labels), generator=generator)
    target_lengths = torch.full([batch_size], labels)
    # what trains: every parameter, or (adapters) those unfreeze_enabled_adapters left on
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    precision = request.get("precision")  # bfloat16: autocast, as Lightning's bf16-mixed

    def update():
        optimizer.zero_grad()
        with _autocast(torch, precision):
            encoded, encoded_lengths = model.encoder(audio_signal=feats, length=feat_lengths)
            predicted, _, _ = model.decoder(targets=targets, target_length=target_lengths)
            if model.joint.fuse_loss_wer:
                loss, _, _, _ = model.joint(
                    encoder_outputs=encoded, decoder_outputs=predicted,
                    encoder_lengths=encoded_lengths, transcripts=targets,
                    transcript_lengths=target_lengths, compute_wer=False,
                )  # fmt: skip
            else:
                joint = model.joint(encoder_outputs=encoded, decoder_outputs=predicted)
                loss = model.loss(log_probs=joint, targets=targets,
                                  input_lengths=encoded_lengths,
                                  target_lengths=target_lengths)  # fmt: skip
        loss.float().mean().backward()
        optimizer.step()

    update()  # the warm-up: AdamW's slots
    if request.get("peak_only"):  # `fit`: one more update, then only the process peak
        update()
        return {"peak RSS MiB": _peak_rss_mib()}
    out["RSS with the training state MiB"] = _rss_mib()
    out["update s"] = timed(update, repeats=ROUNDS, warmup=0).median
    out["peak RSS MiB"] = _peak_rss_mib()
    out["peak RSS above loading MiB"] = out["peak RSS MiB"] - out["RSS after loading MiB"]

    def encoder_pass():  # as asrkit's: the gradient of the encoder output's sum
        optimizer.zero_grad(set_to_none=True)
        with _autocast(torch, precision):
            encoded, _ = model.encoder(audio_signal=feats, length=feat_lengths)
        encoded.float().sum().backward()

    out["encoder fwd+bwd s"] = timed(encoder_pass, repeats=ROUNDS).median
    out["rest of the update s"] = out["update s"] - out["encoder fwd+bwd s"]
    optimizer.zero_grad(set_to_none=True)  # the state between updates: weights, slots
    held = _torch_storages([*model.parameters(), *(
        value for state in optimizer.state.values() for value in state.values()
    )])  # fmt: skip
    out["tensors before the step MiB"] = sum(held.values()) / 2**20
    out["tensor step peak MiB"] = _torch_step_peak(update, held) / 2**20
    out["tensor peak MiB"] = out["tensors before the step MiB"] + out["tensor step peak MiB"]
    return out


def _torch_storages(tensors) -> dict:
    """{storage address: bytes} of the tensors among `tensors`, each storage once."""
    import torch

    storages = (t.untyped_storage() for t in tensors if isinstance(t, torch.Tensor))
    return {s.data_ptr(): s.nbytes() for s in storages if s.nbytes()}


def _torch_step_peak(update, held: dict) -> int:
    """The most bytes of tensors that `update()` makes and holds at once, beyond the
    storages in `held`: every op's outputs are counted as they are made (a dispatch mode
    sees the operators of the forward and the backward pass alike) and a storage is
    dropped when the last tensor on it is freed. No allocator's caching, rounding or
    scratch space: the bytes a GPU would have to hold, PyTorch's counterpart to asrkit's
    allocator peak."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.storages = {}  # address -> [bytes, tensors alive on it]
            self.seen = set()  # ids of the tensors counted
            self.now = self.peak = 0

        def _gone(self, tensor_id, address):
            self.seen.discard(tensor_id)
            entry = self.storages[address]
            entry[1] -= 1
            if not entry[1]:
                self.now -= entry[0]
                del self.storages[address]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            for t in tree_flatten(result)[0]:
                if not isinstance(t, torch.Tensor) or id(t) in self.seen:
                    continue
                storage = t.untyped_storage()
                address, size = storage.data_ptr(), storage.nbytes()
                if not size or address in held:
                    continue
                entry = self.storages.setdefault(address, [size, 0])
                if not entry[1]:
                    self.now += size
                    self.peak = max(self.peak, self.now)
                entry[1] += 1
                self.seen.add(id(t))
                weakref.finalize(t, self._gone, id(t), address)
            return result

    counter = LiveBytes()
    with counter:
        update()
    return counter.peak


def _run_nemo(nemo_python: str, request: dict, script: str = __file__) -> dict:
    """`request` answered by `script` (this tool by default) under NeMo's Python."""
    import subprocess

    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [nemo_python, script, "--child-request", json.dumps(request)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"NeMo child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def add_nemo_arguments(parser) -> None:
    """--nemo-python and --nemo-model: the NeMo side of a comparison."""
    parser.add_argument("--nemo-python", required=True, help="the Python of a venv with NeMo")
    parser.add_argument("--nemo-model", required=True, help="a NeMo Conformer-Transducer .nemo")


def check_nemo_arguments(args, refuse) -> None:
    """`refuse`s (one line, exit 2) a --nemo-python that cannot run or a missing model."""
    if not os.access(args.nemo_python, os.X_OK):
        refuse(f"--nemo-python {args.nemo_python}: not an executable")
    if not Path(args.nemo_model).is_file():
        refuse(f"--nemo-model {args.nemo_model}: no such file")


def main() -> None:
    request = child_request()
    if request is not None:
        reply(_nemo(request) if request["side"] == "nemo" else _asrkit(request))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_nemo_arguments(parser)
    parser.add_argument("--manifest", help="asrkit manifest (.jsonl) of audio (not for step)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--utterances", type=int, default=64)
    parser.add_argument("--tasks", nargs="+", default=["decode", "loss", "train"],
                        choices=["decode", "loss", "train", "step", "fit", "boost"])  # fmt: skip
    parser.add_argument("--boost", metavar="FILE",
                        help="boost: the phrase list (one phrase per line)")  # fmt: skip
    parser.add_argument("--boost-weight", type=float, default=1.0,
                        help="boost: per piece (asrkit) and NeMo's context_score")  # fmt: skip
    parser.add_argument("--shapes", default="2x10x40",
                        help="step: micro-batches, UTTERANCESxSECONDSxLABELS[,...]; fit: "
                             "the utterances' SECONDS and LABELS of the first")  # fmt: skip
    parser.add_argument("--dropout", choices=["off", "config"], default="off",
                        help="step, fit: dropout off on both sides, or the encoder's and "
                             "predictor's rates as the model's config sets them (NeMo's "
                             "joint dropout stays off: asrkit's joint has none)")  # fmt: skip
    parser.add_argument("--adapters", type=int, metavar="DIM",
                        help="step, fit: train NeMo's linear adapters of DIM units on every "
                             "block, the rest frozen, on both sides (NeMo: add_adapter, "
                             "freeze, unfreeze_enabled_adapters; asrkit: model.adapters "
                             "kind linear)")  # fmt: skip
    parser.add_argument("--bfloat16", action="store_true",
                        help="decode, step: also each side in bfloat16 (decode: asrkit's "
                             "--precision bfloat16; step: its train.precision "
                             "mixed_bfloat16; NeMo under PyTorch's CPU autocast, as "
                             "Lightning's bf16-mixed)")  # fmt: skip
    parser.add_argument("--cap", default="6GiB",
                        help="fit: the process memory cap (e.g. 6GiB, 4096MiB)")  # fmt: skip
    args = parser.parse_args()
    check_nemo_arguments(args, _refuse)
    if set(args.tasks) - {"step", "fit"} and not (args.manifest and Path(args.manifest).is_file()):
        _refuse(f"--manifest {args.manifest}: no such file (decode, loss and train read it)")
    if "boost" in args.tasks and not (args.boost and Path(args.boost).is_file()):
        _refuse(f"--boost {args.boost}: no such phrase list (the boost task needs one)")
    shapes = [_parse_shape(text) for text in args.shapes.split(",")]
    cap = _parse_cap(args.cap)
    base = {
        "nemo_model": str(Path(args.nemo_model).resolve()),
        "manifest": str(Path(args.manifest).resolve()) if args.manifest else None,
        "utterances": args.utterances,
        "dropout": args.dropout,
        "adapters": args.adapters,
    }
    if args.boost:
        lines = Path(args.boost).read_text(encoding="utf-8").splitlines()
        base["boost"] = [" ".join(line.split()) for line in lines
                         if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip
        base["boost_weight"] = args.boost_weight
    print(f"{args.nemo_model} ({args.manifest or 'fabricated micro-batches'}); "
          f"{args.repeats} alternating repeats, median (min-max)", flush=True)  # fmt: skip
    scratch = tempfile.TemporaryDirectory()  # the imported experiment: removed after
    base["exp"] = _imported(args.nemo_model, Path(scratch.name) / "exp")
    for task in args.tasks:
        if task == "fit":
            _, seconds, labels = shapes[0]
            print(f"fit: the most utterances of {seconds:g} s, U = {labels} in one update "
                  f"under a process peak of {cap / 2**20:.0f} MiB", flush=True)  # fmt: skip
            for side, extra in (("asrkit, oneDNN", {"side": "asrkit", "env": AS_COMMANDS_RUN}),
                                ("nemo", {"side": "nemo", "loss": "nemo"})):  # fmt: skip
                request = {**base, "task": "step", "seconds": seconds, "labels": labels,
                           "peak_only": True, **extra}  # fmt: skip
                most, peaks = _largest_under(cap, lambda n, r=request: _peak(args, r, n))
                tried = ", ".join(f"{n}: {peak:.0f}" for n, peak in sorted(peaks.items()))
                print(f"  {side:22s} {most} utterances (peak MiB by utterances: {tried})",
                      flush=True)  # fmt: skip
        elif task == "step":
            for batch, seconds, labels in shapes:
                shape = {"batch": batch, "seconds": seconds, "labels": labels}
                requests = {
                    "asrkit": {**base, **shape, "task": task, "side": "asrkit"},
                    "asrkit, oneDNN": {**base, **shape, "task": task, "side": "asrkit",
                                       "env": AS_COMMANDS_RUN},
                    "nemo": {**base, **shape, "task": task, "side": "nemo", "loss": "nemo"},
                    "nemo, vectorised loss": {**base, **shape, "task": task, "side": "nemo",
                                              "loss": "vectorised"},
                }  # fmt: skip
                if args.bfloat16:
                    bf16 = {"precision": "bfloat16"}
                    requests["asrkit, oneDNN, bfloat16"] = {**requests["asrkit, oneDNN"],
                                                            **bf16}  # fmt: skip
                    requests["nemo, vectorised loss, bfloat16"] = {
                        **requests["nemo, vectorised loss"], **bf16}  # fmt: skip
                _compare(f"step, {batch} x {seconds:g} s, U = {labels}", args, requests)
        else:
            requests = {
                "asrkit": {**base, "task": task, "side": "asrkit"},
                "asrkit, oneDNN": {**base, "task": task, "side": "asrkit", "env": AS_COMMANDS_RUN},
                "nemo": {**base, "task": task, "side": "nemo"},
            }  # fmt: skip
            if task == "decode" and args.bfloat16:
                bf16 = {"precision": "bfloat16"}
                requests["asrkit, oneDNN, bfloat16"] = {**requests["asrkit, oneDNN"], **bf16}
                requests["nemo, bfloat16"] = {**requests["nemo"], **bf16}
            _compare(f"{task}", args, requests)
    scratch.cleanup()


def _peak(args, request: dict, utterances: int) -> float:
    """The process peak (MiB) of one side's update on `utterances` utterances."""
    request = {**request, "batch": utterances}
    if request["side"] == "asrkit":
        return run_child(__file__, request, env=request.get("env"))["peak RSS MiB"]
    return _run_nemo(args.nemo_python, request)["peak RSS MiB"]


def _largest_under(cap: int, peak_of, limit: int = 256) -> tuple[int, dict]:
    """The most utterances whose peak (`peak_of(n)`, MiB) stays within `cap` bytes: doubling
    from 1 until over, then halving the gap; (0 if not even one fits, the peaks tried)."""
    peaks, fits, fails = {}, 0, None
    n = 1
    while fails is None and n <= limit:
        peaks[n] = peak_of(n)
        if peaks[n] * 2**20 <= cap:
            fits, n = n, n * 2
        else:
            fails = n
    while fails is not None and fails - fits > 1:
        n = (fits + fails) // 2
        peaks[n] = peak_of(n)
        fits, fails = (n, fails) if peaks[n] * 2**20 <= cap else (fits, n)
    return fits, peaks


def _parse_cap(text: str) -> int:
    units = {"gib": 2**30, "mib": 2**20}
    for unit, size in units.items():
        if text.lower().endswith(unit):
            try:
                value = float(text[: -len(unit)])
            except ValueError:
                break
            if value > 0:
                return int(value * size)
    _refuse(f"--cap: {text!r} is not a size like 6GiB or 4096MiB")
    return 0


def _imported(nemo_model: str, exp: Path) -> str:
    """`asrkit import nemo` into `exp`, in its own process; the experiment's directory."""
    import subprocess

    subprocess.run([sys.executable, "-m", "asrkit.cli.main", "import", "nemo", nemo_model,
                    "--exp-dir", str(exp)], check=True, capture_output=True)  # fmt: skip
    return str(exp)


def _refuse(message: str) -> None:
    print(f"bench_vs_nemo.py: {message}", file=sys.stderr)
    sys.exit(2)


def _parse_shape(text: str) -> tuple[int, float, int]:
    parts = text.lower().split("x")
    try:
        batch, seconds, labels = int(parts[0]), float(parts[1]), int(parts[2])
    except (ValueError, IndexError):
        _refuse(f"--shapes: {text!r} is not UTTERANCESxSECONDSxLABELS (e.g. 2x10x40)")
    if len(parts) != 3 or min(batch, seconds, labels) <= 0:
        _refuse(f"--shapes: {text!r} is not UTTERANCESxSECONDSxLABELS (e.g. 2x10x40)")
    return batch, seconds, labels


def _compare(title: str, args, requests: dict) -> None:
    """Runs each side's request `--repeats` times, alternating, and prints every figure per
    side with the ratio of asrkit's median to each NeMo variant's."""
    figures = {side: [] for side in requests}
    for _ in range(args.repeats):
        for side, request in requests.items():
            if request["side"] == "asrkit":
                figures[side].append(run_child(__file__, request, env=request.get("env")))
            else:
                figures[side].append(_run_nemo(args.nemo_python, request))
    keys = list(dict.fromkeys(k for runs in figures.values() for k in runs[0]))
    print(f"{title}:")
    for key in keys:
        cells, medians = [], {}
        for side, runs in figures.items():
            values = [f[key] for f in runs if key in f]
            if values:
                figure = spread(values)
                medians[side] = figure.median
                cells.append(f"{side} {figure.format('.4g')}")
            else:
                cells.append(f"{side} -")
        ratios = [f"{mine}/{side} {medians[mine] / medians[side]:.3f}"
                  for mine in figures if mine.startswith("asrkit") and mine in medians
                  for side in figures if side.startswith("nemo") and side in medians
                  and medians[side]]  # fmt: skip
        print(f"  {key:36s} " + " | ".join(cells) + "  " + ", ".join(ratios), flush=True)


if __name__ == "__main__":
    main()
