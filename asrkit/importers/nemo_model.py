"""A NeMo transducer (`.nemo`) as an ordinary asrkit experiment: `asrkit import nemo`.

What is read: NeMo's EncDecRNNTBPEModel and EncDecHybridRNNTCTCBPEModel (whose CTC head
becomes the network's `ctc_head`) with a ConformerEncoder (`striding` x4 Conformer or
`dw_striding` FastConformer, rel_pos attention), an RNNTDecoder (LSTM, blank as padding),
an RNNTJoint (RNN-T or TDT), a SentencePiece tokenizer and the
AudioToMelSpectrogramPreprocessor. Every setting that changes what the model computes is
checked; one asrkit does not implement is refused with a line naming the config key and
its value. The training settings are mapped where asrkit has them — the loss' reduction,
the hybrid's CTC weight, FastEmit, SpecAugment, the dropout rates — and every one it does
not model is listed by key in the import's notes (and in the recorded config's comments).
The encoder is asrkit's Conformer with NeMo's options (relative attention, NeMo's
subsampling, xscaling, torch's norm epsilon, BatchNorm).

The experiment is written into a fresh temporary directory beside `--exp-dir` and renamed
into place only once everything checked out and was written: a failed import leaves
nothing behind.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from asrkit.config import (
    AdaptersConfig,
    DataConfig,
    DecodeConfig,
    EncoderConfig,
    ExperimentConfig,
    FeatureConfig,
    LossConfig,
    ModelConfig,
    PredictorConfig,
    TrainConfig,
)
from asrkit.errors import InputError

SUPPORTED_MODELS = ("EncDecRNNTBPEModel", "EncDecHybridRNNTCTCBPEModel")
_TINY = 1.1754943508222875e-38  # torch.finfo(torch.float32).tiny
_EPS = 1.1920928955078125e-07  # torch.finfo(torch.float32).eps
TORCH_NORM_EPSILON = 1e-5  # torch's LayerNorm and BatchNorm default, which NeMo keeps
TORCH_BATCH_NORM_MOMENTUM = 0.1  # torch's weight of a new batch (Keras': 1 - it)


class UnsupportedNemoModel(InputError):
    """A NeMo model with a setting asrkit does not implement; the message names the key."""


@dataclass(frozen=True)
class ImportPlan:
    """What a NeMo config becomes: the asrkit config and what was left out."""

    config: ExperimentConfig
    kind: str  # "RNN-T" or "TDT"
    notes: tuple[str, ...] = field(default=())
    adapter: str | None = None  # the enabled linear adapter's name (model.adapters linear)
    dropped_adapters: tuple[str, ...] = ()  # disabled adapters: imported without them


@dataclass(frozen=True)
class ImportSummary:
    exp_dir: Path
    plan: ImportPlan
    parameters: int
    vocabulary: int  # tokens, blank not included
    lower_case: bool


class _Section:
    """One section of the NeMo config, read with NeMo's defaults and checked by key."""

    def __init__(self, source: str, name: str, data):
        if not isinstance(data, dict):
            raise UnsupportedNemoModel(f"{source}: the config has no '{name}' section")
        self.source, self.name, self.data = source, name, data

    def get(self, key: str, default=None):
        value = self.data.get(key, default)
        return default if value is None and default is not None else value

    def refuse(self, key: str, value, supported: str):
        raise UnsupportedNemoModel(
            f"{self.source}: {self.name}.{key}: {value!r} is not supported (asrkit imports "
            f"{supported})"
        )

    def require(self, key: str, default, allowed: tuple) -> object:
        value = self.data.get(key, default)
        if value not in allowed:
            self.refuse(key, value, " or ".join(repr(a) for a in allowed))
        return value

    def target(self, *expected: str) -> None:
        target = str(self.data.get("_target_", ""))
        if target.rsplit(".", 1)[-1] not in expected:
            self.refuse("_target_", target or None, " or ".join(expected))


def plan_import(nemo: dict, source: str) -> ImportPlan:
    """The asrkit config of a NeMo model config (`model_config.yaml`)."""
    notes: list[str] = []
    target = str(nemo.get("target", ""))
    if target and target.rsplit(".", 1)[-1] not in SUPPORTED_MODELS:
        raise UnsupportedNemoModel(
            f"{source}: target: {target!r} is not supported (asrkit imports "
            f"{' or '.join(SUPPORTED_MODELS)}: transducers with a SentencePiece tokenizer)"
        )
    hybrid = target.endswith("EncDecHybridRNNTCTCBPEModel") or "aux_ctc" in nemo
    tokenizer = _Section(source, "tokenizer", nemo.get("tokenizer"))
    tokenizer.require("type", "bpe", ("bpe",))
    features = _features(_Section(source, "preprocessor", nemo.get("preprocessor")), notes)
    encoder = _encoder(_Section(source, "encoder", nemo.get("encoder")), features, notes)
    predictor = _predictor(_Section(source, "decoder", nemo.get("decoder")), notes)
    joint = _Section(source, "joint", nemo.get("joint"))
    joint.target("RNNTJoint")
    net = _Section(source, "joint.jointnet", joint.get("jointnet", {}))
    activation = net.require("activation", "relu", ("relu", "tanh"))
    if net.get("dropout", 0.0):
        notes.append(f"joint.jointnet.dropout {net.get('dropout')} is not modelled (the joint "
                     "trains without dropout)")  # fmt: skip
    durations = _durations(nemo, joint, source, notes)
    greedy = _Section(source, "decoding.greedy", (nemo.get("decoding") or {}).get("greedy") or {})
    max_symbols = int(greedy.get("max_symbols", 10) or 10)
    adapters, adapter, dropped = _adapters(nemo, source, encoder.d_model, notes)
    model = ModelConfig(
        encoder=encoder, predictor=predictor, joint_dim=int(net.get("joint_hidden", 640)),
        joint_activation=activation, durations=durations, ctc_head=hybrid, torch_biases=True,
        adapters=adapters,
    )  # fmt: skip
    data = DataConfig(tokenizer="tokenizer", cmvn=None, **_spec_augment(nemo, source, notes))
    loss = _loss(nemo, source, bool(durations), hybrid, notes)
    config = ExperimentConfig(
        model=model, loss=loss, data=data, features=features, train=_train(nemo, notes),
        decode=DecodeConfig(max_symbols_per_step=max_symbols),
    )  # fmt: skip
    return ImportPlan(config, "TDT" if durations else "RNN-T", tuple(notes), adapter, dropped)


def _adapters(nemo: dict, source: str, d_model: int, notes: list[str]):
    """NeMo's `adapters` section (ASRAdapterModelMixin.add_adapter): one enabled
    LinearAdapter on the encoder is asrkit's `model.adapters.kind: linear` (applied after
    each block, as NeMo's "post" location); disabled ones are left out with a note. ->
    (AdaptersConfig, the enabled adapter's name or None, the disabled ones' names)."""
    section = nemo.get("adapters") or {}
    names = [k for k in section if k != "global_cfg"]
    modules = ((section.get("global_cfg") or {}).get("adapter_meta_cfg") or {}).get("modules")
    enabled = [n for n in names if (section.get(n) or {}).get("enabled", True)]
    dropped = tuple(n for n in names if n not in enabled)
    for name in dropped:
        notes.append(f"adapters.{name} is disabled in the checkpoint: imported without it")
    if not enabled:
        return AdaptersConfig(), None, dropped
    if len(enabled) > 1:
        raise UnsupportedNemoModel(
            f"{source}: adapters {enabled} are enabled together (asrkit imports one enabled "
            "linear adapter on the encoder; disable the others with set_enabled_adapters)"
        )
    name = enabled[0]
    adapter = _Section(source, f"adapters.{name}", section[name])
    if (modules or {}).get(name, "encoder") != "encoder":
        adapter.refuse("module", modules.get(name), "'encoder' (adapters on the encoder)")
    adapter.target("LinearAdapter")
    adapter.require("activation", "swish", ("swish",))
    adapter.require("norm_position", "pre", ("pre",))
    if int(adapter.get("in_features", d_model)) != d_model:
        adapter.refuse("in_features", adapter.get("in_features"), f"{d_model} (the encoder's)")
    strategy = _Section(source, f"adapters.{name}.adapter_strategy",
                        adapter.get("adapter_strategy") or {})  # fmt: skip
    if strategy.get("_target_"):
        strategy.target("ResidualAddAdapterStrategy")
    for key in ("stochastic_depth", "l2_lambda"):
        if strategy.get(key, 0.0):
            notes.append(f"adapters.{name}.adapter_strategy.{key} {strategy.get(key)} is "
                         "not modelled (the adapter trains without it)")  # fmt: skip
    if adapter.get("dropout", 0.0):
        notes.append(f"adapters.{name}.dropout {adapter.get('dropout')} is not modelled (the "
                     "adapter trains without dropout)")  # fmt: skip
    return AdaptersConfig(kind="linear", dim=int(adapter.get("dim"))), name, dropped


# NeMo's rnnt_reduction (and ctc_reduction) -> loss.normalize_by; asrkit divides the
# window's summed loss by its count over all micro-batches and replicas.
REDUCTIONS = {"mean_volume": "tokens", "mean_batch": "utterances", "mean": "utterance_tokens"}


def _loss(nemo: dict, source: str, tdt: bool, hybrid: bool, notes: list[str]) -> LossConfig:
    """NeMo's loss settings: the reduction, the TDT sigma and omega, FastEmit, the hybrid's
    CTC weight (interpolated, as NeMo's hybrids combine their losses)."""
    section = nemo.get("loss") or {}
    kwargs = section.get("tdt_kwargs" if tdt else f"{section.get('loss_name', 'default')}_kwargs")
    kwargs = kwargs or section.get("warprnnt_numba_kwargs") or {}
    reduction = nemo.get("rnnt_reduction", "mean_batch")
    if reduction not in REDUCTIONS:  # a training setting: the model decodes as it is
        notes.append(
            f"rnnt_reduction {reduction!r} divides the loss by no count asrkit trains with "
            "(loss.normalize_by: none): before training, set loss.normalize_by to tokens "
            "(mean_volume), utterances (mean_batch) or utterance_tokens (mean)"
        )
    settings = dict(kind="tdt" if tdt else "full", normalize_by=REDUCTIONS.get(reduction, "none"))
    if tdt:
        settings.update(sigma=float(kwargs.get("sigma", 0.0)),
                        omega=float(kwargs.get("omega", 0.0)))  # fmt: skip
    fastemit = float(kwargs.get("fastemit_lambda", 0.0) or 0.0)
    if fastemit and tdt:
        notes.append(f"loss.tdt_kwargs.fastemit_lambda {fastemit} is not modelled (asrkit's "
                     "FastEmit is the RNN-T loss')")  # fmt: skip
    elif fastemit:
        settings["fastemit_lambda"] = fastemit
    clamp = kwargs.get("clamp", -1.0)
    if clamp not in (None, -1, -1.0):
        notes.append(f"the loss' clamp {clamp} (a bound on the joint's gradient) is not modelled")
    if hybrid:
        aux = nemo.get("aux_ctc") or {}
        settings.update(ctc_weight=float(aux.get("ctc_loss_weight", 0.5)), ctc_interpolate=True)
        ctc_reduction = aux.get("ctc_reduction", "mean_batch")
        if ctc_reduction not in REDUCTIONS:
            notes.append(
                f"aux_ctc.ctc_reduction {ctc_reduction!r} divides the CTC loss by no count "
                f"asrkit trains with: it is divided as the transducer's ({reduction})"
            )
        elif REDUCTIONS[ctc_reduction] != settings["normalize_by"]:
            # each divided by its own count over the whole window, as NeMo's hybrid does
            settings["ctc_normalize_by"] = REDUCTIONS[ctc_reduction]
    try:
        return LossConfig(**settings)
    except ValueError as err:
        raise UnsupportedNemoModel(f"{source}: loss: {err}") from None


def _train(nemo: dict, notes: list[str]) -> TrainConfig:
    """NeMo's AdamW settings (betas, eps, weight decay); its learning rate and schedule are
    the pre-training's, not a fine-tuning's: left to the fine-tuning config."""
    optim = nemo.get("optim") or {}
    if not optim:
        return TrainConfig()
    name = str(optim.get("name", "adamw")).lower()
    if name not in ("adamw", "adam"):
        notes.append(f"optim.name {name!r}: asrkit fine-tunes with AdamW")
        return TrainConfig()
    if name == "adam" and optim.get("weight_decay"):
        notes.append("optim.name 'adam' decays weights inside the gradient (L2); asrkit's "
                     "AdamW decouples it")  # fmt: skip
    betas = optim.get("betas") or [0.9, 0.999]
    notes.append(f"optim.lr {optim.get('lr')} and optim.sched are the pre-training's: set "
                 "train.learning_rate and its schedule for fine-tuning")  # fmt: skip
    try:
        return TrainConfig(
            adam_beta_1=float(betas[0]), adam_beta_2=float(betas[1]),
            adam_epsilon=float(optim.get("eps", 1e-8)),
            weight_decay=float(optim.get("weight_decay", 0.0) or 0.0),
        )  # fmt: skip
    except (TypeError, ValueError, IndexError):
        notes.append(f"optim: {optim!r} is not read (asrkit's AdamW defaults are kept)")
        return TrainConfig()


def _spec_augment(nemo: dict, source: str, notes: list[str]) -> dict:
    """NeMo's spec_augment section as asrkit's data.spec_* keys (none: SpecAugment off)."""
    spec = nemo.get("spec_augment")
    if not spec:
        return {"spec_augment": False}
    section = _Section(source, "spec_augment", spec)
    target = str(section.get("_target_", ""))
    if target.rsplit(".", 1)[-1] != "SpectrogramAugmentation":  # training only: noted
        notes.append(f"spec_augment {target!r} is not modelled: fine-tuning runs without "
                     "SpecAugment unless data.spec_augment is set")  # fmt: skip
        return {"spec_augment": False}
    if section.get("rect_masks", 0):
        notes.append(f"spec_augment.rect_masks {section.get('rect_masks')} (SpecCutout) is "
                     "not modelled")  # fmt: skip
    width = section.get("time_width", 10)
    if not isinstance(width, int | float) or (isinstance(width, float) and not 0 <= width <= 1):
        notes.append(f"spec_augment.time_width {width!r} is not read (a fraction in [0, 1] "
                     "or a frame count): fine-tuning runs without SpecAugment unless "
                     "data.spec_augment is set")  # fmt: skip
        return {"spec_augment": False}
    freq_masks, time_masks = int(section.get("freq_masks", 0)), int(section.get("time_masks", 0))
    return dict(
        spec_augment=bool(freq_masks or time_masks), spec_freq_masks=freq_masks,
        spec_freq_width=int(section.get("freq_width", 10)), spec_time_masks=time_masks,
        **({"spec_time_width": float(width)} if isinstance(width, float)
           else {"spec_time_frames": int(width)}),
    )  # fmt: skip


def _features(pre: _Section, notes: list[str]) -> FeatureConfig:
    pre.target("AudioToMelSpectrogramPreprocessor")
    rate = int(pre.get("sample_rate", 16000))
    win = pre.get("n_window_size") or int(pre.get("window_size", 0.02) * rate)
    hop = pre.get("n_window_stride") or int(pre.get("window_stride", 0.01) * rate)
    n_fft = pre.get("n_fft") or 2 ** math.ceil(math.log2(win))
    pre.require("window", "hann", ("hann",))
    pre.require("log", True, (True,))
    pre.require("log_zero_guard_type", "add", ("add",))
    pre.require("frame_splicing", 1, (1,))
    pre.require("mag_power", 2.0, (2, 2.0))
    pre.require("mel_norm", "slaney", ("slaney",))
    pre.require("exact_pad", False, (False,))
    pre.require("stft_exact_pad", False, (False,))
    pre.require("stft_conv", False, (False,))
    normalize = pre.require("normalize", "per_feature", ("per_feature", "NA", None))
    guard = pre.get("log_zero_guard_value", 2**-24)
    guard = {"tiny": _TINY, "eps": _EPS}.get(guard, guard)
    if not isinstance(guard, int | float):
        pre.refuse("log_zero_guard_value", guard, "a number, 'tiny' or 'eps'")
    preemph = pre.get("preemph", 0.97)
    if pre.get("dither", 1e-5):
        notes.append(f"preprocessor.dither {pre.get('dither', 1e-5)} is not modelled (asrkit "
                     "extracts training features once, without dither)")  # fmt: skip
    highfreq = pre.get("highfreq") or rate / 2
    try:
        return FeatureConfig(
            kind="nemo", sample_rate=rate, num_mel_bins=int(pre.get("features", 64)),
            frame_length=int(win), frame_step=int(hop), fft_length=int(n_fft),
            lower_edge_hz=float(pre.get("lowfreq", 0.0) or 0.0), upper_edge_hz=float(highfreq),
            log_floor=float(guard), preemphasis=float(preemph or 0.0),
            normalize="per_feature" if normalize == "per_feature" else "none",
        )  # fmt: skip
    except ValueError as err:
        raise UnsupportedNemoModel(f"{pre.source}: preprocessor: {err}") from None


def _encoder(enc: _Section, features: FeatureConfig, notes: list[str]) -> EncoderConfig:
    enc.target("ConformerEncoder", "ConformerEncoderAdapter")
    enc.require("self_attention_model", "rel_pos", ("rel_pos",))
    enc.require("untie_biases", True, (True,))
    conv_norm = enc.require("conv_norm_type", "batch_norm", ("batch_norm", "layer_norm"))
    causal_subsampling = enc.require("causal_downsampling", False, (False, True))
    enc.require("subsampling", "striding", ("striding", "dw_striding"))
    enc.require("feat_out", -1, (-1,))
    enc.require("reduction", None, (None,))
    enc.require("global_tokens", 0, (0,))
    kernel = int(enc.get("conv_kernel_size", 31))
    streaming = _streaming(enc, kernel, bool(causal_subsampling), notes)
    if int(enc.get("feat_in", features.num_mel_bins)) != features.num_mel_bins:
        enc.refuse("feat_in", enc.get("feat_in"), f"{features.num_mel_bins} (the features)")
    d_model = int(enc.get("d_model"))
    channels = int(enc.get("subsampling_conv_channels", -1))
    dropout = float(enc.get("dropout", 0.1))
    if enc.get("dropout_emb", 0.0):
        notes.append(f"encoder.dropout_emb {enc.get('dropout_emb')} (on the relative positions) "
                     "is not modelled (trained without)")  # fmt: skip
    try:
        return EncoderConfig(
            kind="conformer", d_model=d_model, num_blocks=int(enc.get("n_layers")),
            num_heads=int(enc.get("n_heads", 4)), kernel_size=kernel, attention="relative",
            subsampling=str(enc.get("subsampling", "striding")),
            subsampling_factor=int(enc.get("subsampling_factor", 4)),
            subsampling_filters=channels if channels > 0 else d_model,
            ff_expansion=int(enc.get("ff_expansion_factor", 4)),
            xscaling=bool(enc.get("xscaling", True)), use_bias=bool(enc.get("use_bias", True)),
            norm_epsilon=TORCH_NORM_EPSILON,
            conv_norm="layer" if conv_norm == "layer_norm" else "frozen_batch",
            causal_subsampling=bool(causal_subsampling), **streaming,
            batch_norm_momentum=EncoderConfig.batch_norm_momentum
            if conv_norm == "layer_norm" else 1.0 - TORCH_BATCH_NORM_MOMENTUM,
            dropout=dropout,
            attention_dropout=_rate(enc, "dropout_att", dropout),
            pre_encoder_dropout=_rate(enc, "dropout_pre_encoder", dropout), final_norm="block",
            stochastic_depth=float(enc.get("stochastic_depth_drop_prob", 0.0) or 0.0),
            stochastic_depth_mode=str(enc.get("stochastic_depth_mode", "linear")),
            stochastic_depth_start=int(enc.get("stochastic_depth_start_layer", 1)),
        )  # fmt: skip
    except (TypeError, ValueError) as err:
        raise UnsupportedNemoModel(f"{enc.source}: encoder: {err}") from None


def _streaming(enc: _Section, kernel: int, causal_subsampling: bool, notes: list[str]) -> dict:
    """The encoder's context: full (NeMo's [-1, -1]), or a cache-aware streaming model's
    chunked_limited attention with one or more look-aheads, causal convolutions and
    causal subsampling -> the EncoderConfig streaming keys."""
    style = enc.require("att_context_style", "regular", ("regular", "chunked_limited"))
    context = enc.get("att_context_size")
    contexts = [] if context is None else list(context)
    if contexts and not isinstance(contexts[0], list | tuple):
        contexts = [contexts]
    conv_context = enc.get("conv_context_size")
    centred = conv_context in (None, "default", [(kernel - 1) // 2, (kernel - 1) // 2])
    if not contexts or contexts == [[-1, -1]]:  # full context: both styles attend alike
        if not centred:
            enc.refuse("conv_context_size", conv_context, "a centred kernel (null) with full "
                       "attention context")  # fmt: skip
        return {}
    wanted = ("[[left, right], ...] with left a multiple of right + 1 and one left for all, "
              "chunked_limited, causal convolutions and causal_downsampling (a cache-aware "
              "streaming model), or [-1, -1] (full context)")  # fmt: skip
    ok = style == "chunked_limited" and causal_subsampling and all(
        isinstance(c, list | tuple) and len(c) == 2 and all(isinstance(v, int) for v in c)
        and c[1] >= 0 and (c[0] == -1 or (c[0] >= 0 and c[0] % (c[1] + 1) == 0))
        and c[0] == contexts[0][0]
        for c in contexts
    )  # fmt: skip
    if not ok:
        enc.refuse("att_context_size", context, wanted)
    if conv_context not in ("causal", [kernel - 1, 0]):
        enc.refuse("conv_context_size", conv_context, "causal in a cache-aware streaming model")
    probs = enc.get("att_context_probs")
    if probs and len(set(probs)) > 1:
        notes.append(f"encoder.att_context_probs {list(probs)}: asrkit draws the look-aheads "
                     "uniformly when it trains")  # fmt: skip
    left, right = contexts[0]
    return dict(chunk_frames=right + 1, left_chunks=-1 if left < 0 else left // (right + 1),
                conv_context="causal", lookaheads=tuple(c[1] for c in contexts))  # fmt: skip


def _rate(enc: _Section, key: str, dropout: float) -> float | None:
    """A NeMo dropout rate as asrkit's key (None where it equals `dropout`)."""
    value = enc.get(key, dropout)
    return None if value is None or float(value) == dropout else float(value)


def _predictor(dec: _Section, notes: list[str]) -> PredictorConfig:
    dec.target("RNNTDecoder")
    dec.require("normalization_mode", None, (None,))
    dec.require("blank_as_pad", True, (True,))
    if dec.get("random_state_sampling", False):  # NeMo samples it in training only
        notes.append("decoder.random_state_sampling is not modelled: the predictor's state "
                     "starts at zeros in training too, as in NeMo's inference")  # fmt: skip
    net = _Section(dec.source, "decoder.prednet", dec.get("prednet"))
    hidden = int(net.get("pred_hidden"))
    if net.get("rnn_hidden_size", -1) not in (-1, hidden):
        net.refuse("rnn_hidden_size", net.get("rnn_hidden_size"), f"-1 (= pred_hidden {hidden})")
    return PredictorConfig(
        kind="lstm", embed_dim=hidden, units=hidden,
        num_layers=int(net.get("pred_rnn_layers", 1)), dropout=float(net.get("dropout", 0.0)),
        blank_as_pad=True,
    )  # fmt: skip


def _durations(nemo: dict, joint: _Section, source: str, notes: list[str]) -> tuple[int, ...]:
    """The TDT durations of a joint with extra outputs; a joint whose extra outputs are not
    durations (multi-blank) is refused: it changes what the network outputs."""
    extra = int(joint.get("num_extra_outputs", 0) or 0)
    loss = nemo.get("loss") or {}
    name = loss.get("loss_name", "default")
    if name not in ("default", "tdt", "warprnnt_numba", "pytorch") and not extra:
        notes.append(f"loss.loss_name {name!r} is a training setting: asrkit trains with its "
                     "RNN-T loss (loss.kind)")  # fmt: skip
    if not extra:
        return ()
    candidates = (
        (nemo.get("model_defaults") or {}).get("tdt_durations"),
        (loss.get("tdt_kwargs") or {}).get("durations"),
        (nemo.get("decoding") or {}).get("durations"),
    )
    durations = next((list(d) for d in candidates if d), None)
    if durations is None or len(durations) != extra:
        raise UnsupportedNemoModel(
            f"{source}: joint.num_extra_outputs: {extra} extra outputs without as many TDT "
            f"durations (found {durations}); asrkit imports RNN-T and TDT joints"
        )
    try:
        return ModelConfig(durations=tuple(int(d) for d in durations)).durations
    except ValueError as err:
        raise UnsupportedNemoModel(f"{source}: TDT durations: {err}") from None


def _notes_header(source: str, notes: tuple[str, ...]) -> str:
    """The recorded config's opening comments: where it came from, what was left out."""
    lines = [f"# Imported from {Path(source).name} by `asrkit import nemo`."]
    if notes:
        lines.append("# NeMo settings this config does not model:")
        lines += [f"#   - {note}" for note in notes]
    return "\n".join(lines) + "\n"


# What an imported model is taken to have been trained on when its config does not say
# (train_ds.max_duration): NeMo's FastConformer templates filter training audio to 20 s.
NEMO_DEFAULT_MAX_SECONDS = 20.0


def nemo_training_lengths(nemo: dict):
    """The longest training utterance of a NeMo model: its `train_ds.max_duration`, else
    `NEMO_DEFAULT_MAX_SECONDS`."""
    from asrkit.experiment import TrainingLengths

    value = (nemo.get("train_ds") or {}).get("max_duration")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return TrainingLengths(float(value), source="the NeMo config's train_ds.max_duration")
    return TrainingLengths(
        NEMO_DEFAULT_MAX_SECONDS,
        source="not in the NeMo config (train_ds.max_duration): NeMo's templates' 20 s",
    )


def _adapter_key(key: str, adapter: str | None) -> str:
    """`encoder.layers.N.adapter_layer.<name>.module...` -> `encoder.layers.N.adapter.module...`
    for the enabled adapter (its name is NeMo's choice, not the network's)."""
    marker = f".adapter_layer.{adapter}."
    return key.replace(marker, ".adapter.") if adapter and marker in key else key


def import_nemo(nemo_path: str | os.PathLike, exp_dir: str | os.PathLike) -> ImportSummary:
    """Reads, checks and converts a .nemo file into the experiment `exp_dir` (which must
    not exist or be empty)."""
    from asrkit.importers.nemo_archive import read_nemo

    exp_dir = Path(exp_dir)
    archive = read_nemo(nemo_path)
    source = str(archive.path)
    plan = plan_import(archive.config, source)
    # TensorFlow only once the archive and its config checked out.
    from asrkit.checkpoints import CheckpointManager, TrainState
    from asrkit.config import dump_config
    from asrkit.experiment import (
        CONFIG_FILE,
        TOKENIZER_DIR,
        build_network,
        write_training_lengths,
    )
    from asrkit.importers.nemo_tokenizer import convert_nemo_tokenizer
    from asrkit.importers.nemo_weights import assign_nemo_transducer, check_feature_buffers

    weights = {
        _adapter_key(k, plan.adapter): v for k, v in archive.weights.items()
        if not k.startswith(("preprocessor.", "spec_augmentation."))
        and not any(f".adapter_layer.{name}." in k for name in plan.dropped_adapters)
    }  # fmt: skip
    check_feature_buffers(archive.weights, plan.config.features, source)
    model_ref = (archive.config.get("tokenizer") or {}).get("model_path")
    if not model_ref:
        raise UnsupportedNemoModel(f"{source}: tokenizer.model_path is missing")
    tmp = Path(tempfile.mkdtemp(prefix=f".{exp_dir.name}.importing-", dir=exp_dir.parent))
    try:
        tokenizer = convert_nemo_tokenizer(
            archive.member(model_ref), tmp / TOKENIZER_DIR, f"{source}:{model_ref}"
        )
        network = build_network(plan.config, tokenizer.vocab_size)
        assign_nemo_transducer(network, weights, source)
        (tmp / CONFIG_FILE).write_text(_notes_header(source, plan.notes) + dump_config(plan.config))
        write_training_lengths(tmp, nemo_training_lengths(archive.config))
        CheckpointManager(tmp / "checkpoints").save(
            network, TrainState(epoch=0, micro_batches=0, updates=0)
        )
        parameters = sum(int(v.numpy().size) for v in network.trainable_weights)
        if exp_dir.exists():
            exp_dir.rmdir()  # empty (checked before any work); a race is an OSError
        os.replace(tmp, exp_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ImportSummary(
        exp_dir, plan, parameters, tokenizer.vocab_size - 1, tokenizer.settings.lower_case
    )
