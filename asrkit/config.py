"""Frozen configuration dataclasses — the only place defaults live — and the strict loader.

A YAML recipe is read into `ExperimentConfig`; an unknown key or a value of the wrong type
is an error naming the key and its section; `--set a.b=c` overrides are applied before.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import yaml

from asrkit.errors import UserError


def _at_least(config, section: str, **minimums) -> None:
    """Range checks that name the key: each field must be >= its minimum."""
    for key, low in minimums.items():
        value = getattr(config, key)
        if value is not None and value < low:
            raise ValueError(f"{section}.{key} must be >= {low}, got {value}")


def _one_of(config, section: str, **choices) -> None:
    """Enumerated settings that name the key: each field must be one of its choices."""
    for key, allowed in choices.items():
        value = getattr(config, key)
        if value not in allowed:
            raise ValueError(f"{section}.{key} must be one of {allowed}, got {value!r}")


def _positive(config, section: str, *keys) -> None:
    for key in keys:
        value = getattr(config, key)
        if value is not None and not value > 0:
            raise ValueError(f"{section}.{key} must be > 0, got {value}")


FEATURE_KINDS = ("asrkit", "nemo")
FEATURE_NORMALIZATIONS = ("none", "per_feature")


@dataclass(frozen=True)
class FeatureConfig:
    """Log-mel filterbank front end (see `asrkit.features`).

    `kind: asrkit` — a framed STFT without padding, TensorFlow's mel matrix, log(x + floor).
    `kind: nemo` — NeMo's AudioToMelSpectrogramPreprocessor (`asrkit.nemo_mel`; what an
    imported NeMo model was trained on): a centred STFT of `fft_length` with the Hann window
    of `frame_length`, librosa's Slaney mel filterbank, `preemphasis`, `normalize` and
    `pad_to`; `log_floor` is NeMo's log guard."""

    kind: str = "asrkit"  # asrkit | nemo
    sample_rate: int = 16_000
    num_mel_bins: int = 80
    frame_length: int = 400  # samples (25 ms at 16 kHz)
    frame_step: int = 160  # samples (10 ms at 16 kHz)
    fft_length: int = 512
    lower_edge_hz: float = 20.0
    upper_edge_hz: float = 7_600.0
    log_floor: float = 1e-6
    preemphasis: float = 0.0  # nemo: x[t] - p x[t-1]; 0 = none
    normalize: str = "none"  # nemo: none | per_feature (over each utterance's valid frames)
    pad_to: int = 0  # nemo: the time axis padded to a multiple of this; 0 = none

    def __post_init__(self):
        _one_of(self, "features", kind=FEATURE_KINDS, normalize=FEATURE_NORMALIZATIONS)
        if self.kind == "asrkit" and (self.preemphasis or self.normalize != "none" or self.pad_to):
            raise ValueError(
                "features.preemphasis, features.normalize and features.pad_to are settings of "
                "features.kind: nemo"
            )
        if not 0 < self.frame_step <= self.frame_length <= self.fft_length:
            raise ValueError(
                "FeatureConfig: need 0 < frame_step <= frame_length <= fft_length, got "
                f"{self.frame_step}, {self.frame_length}, {self.fft_length}"
            )
        if not 0 <= self.lower_edge_hz < self.upper_edge_hz <= self.sample_rate / 2:
            raise ValueError("FeatureConfig: need 0 <= lower_edge_hz < upper_edge_hz <= rate/2")

    @property
    def lm_tokens_by_id(self) -> bool:
        """Whether n-gram LMs name this model's pieces by their ids: NeMo's token LMs do,
        and a model on NeMo's front end was imported from NeMo."""
        return self.kind == "nemo"


# The keys only one kind reads (every other key applies to every kind).
PREDICTOR_KEYS = {"lstm": ("num_layers", "blank_as_pad"), "stateless": ("context_size",)}
LOSS_KEYS = {
    "full": ("delay_penalty", "fastemit_lambda"),
    "pruned": ("prune_range", "simple_scale", "warmup_updates", "lm_only_scale",
               "am_only_scale", "pruned_chunk_mb"),
    "tdt": ("sigma", "omega"),
}  # fmt: skip


def _refuse_other_kinds(config, section: str, keys: dict[str, tuple[str, ...]]) -> None:
    """A key that only another kind reads, set away from its default, is an error naming
    it and the kind that reads it (it would otherwise be ignored without a word)."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    for kind, own in keys.items():
        if kind == config.kind:
            continue
        for key in own:
            if getattr(config, key) != defaults[key]:
                raise ValueError(
                    f"{section}.{key} applies to {section}.kind {kind} only (this one is "
                    f"{config.kind!r}): drop it, or set the kind that reads it"
                )


ENCODERS = ("conformer", "lstm")
ATTENTIONS = ("rotary", "relative")  # see model.encoder.attention
SUBSAMPLINGS = ("valid", "striding", "dw_striding")  # see model.encoder.subsampling
JOINT_ACTIVATIONS = ("tanh", "relu")
# What a window's summed loss is divided by (NeMo's reduction in brackets): its tokens
# (mean_volume), its utterances (mean_batch), or its utterances after each utterance's
# loss is divided by its own tokens (mean). "none" records an imported model's loss divided
# by no count (NeMo's sum): such a model decodes; training refuses it until a count is set.
NORMALIZERS = ("tokens", "utterances", "utterance_tokens", "none")
LOSSES = ("full", "pruned", "tdt")
PREDICTORS = ("lstm", "stateless")
FINAL_NORMS = ("block", "encoder", "none")  # see model.encoder.final_norm
CONV_CONTEXTS = ("causal", "chunk")  # see model.encoder.conv_context
CONV_NORMS = ("layer", "batch", "frozen_batch")  # see model.encoder.conv_norm
# The keys of model.encoder each kind reads; any other key set away from its default is an
# error naming it (and a recorded config holds only these).
LSTM_ENCODER_KEYS = ("kind", "lstm_units", "lstm_layers", "subsampling_filters", "dropout",
                     "recompute")  # fmt: skip
STREAMING_KEYS = ("left_chunks", "dynamic_chunks", "conv_context", "lookaheads")
# (the streaming keys need chunk_frames > 0)


@dataclass(frozen=True)
class EncoderConfig:
    """`kind: conformer` — one Conformer encoder whose variants are options: asrkit's own
    recipes (rotary attention, `valid` x4 subsampling) and NeMo's Conformer and
    FastConformer (relative attention, `striding` x4 or `dw_striding` x8, xscaling, torch's
    norm epsilon, BatchNorm), as `asrkit import nemo` sets them (docs/layout.md has the
    table). `kind: lstm` — unidirectional LSTM layers over `valid` x4 subsampling; it reads
    only LSTM_ENCODER_KEYS."""

    kind: str = "conformer"  # conformer | lstm
    d_model: int = 144  # conformer width
    num_blocks: int = 16
    num_heads: int = 4
    kernel_size: int = 31
    # "rotary" (rotary position embeddings) or "relative" (Transformer-XL relative positions
    # with untied per-head biases: NeMo's rel_pos).
    attention: str = "rotary"
    # "valid" (two unpadded 3x3 stride-2 convolutions, x4: streams piece by piece),
    # "striding" (NeMo's: padded by 1) or "dw_striding" (NeMo's depthwise, FastConformer),
    # by `subsampling_factor` (a power of 2; 4 for valid).
    subsampling: str = "valid"
    subsampling_factor: int = 4
    subsampling_filters: int = 144
    ff_expansion: int = 4  # the feed-forward width is ff_expansion x d_model
    xscaling: bool = False  # the subsampled frames x sqrt(d_model) (NeMo's Conformer)
    use_bias: bool = True  # the blocks' linear and convolution layers have biases
    norm_epsilon: float = 1e-3  # every LayerNorm's and BatchNorm's (torch, NeMo: 1e-5)
    # The convolution module's norm: "layer"; "batch" (BatchNorm from each replica's batch
    # statistics: micro-batches then differ from their union, so accumulation is not exact);
    # "frozen_batch" (BatchNorm from its running statistics, never updated: exact).
    conv_norm: str = "layer"
    batch_norm_momentum: float = 0.99  # conv_norm batch: the running statistics' (NeMo: 0.9)
    lstm_units: int = 320
    lstm_layers: int = 2
    dropout: float = 0.1
    # Conformer: the rate on the attention weights and on the subsampled frames entering
    # the blocks (NeMo's dropout_att and dropout_pre_encoder); null: `dropout`.
    attention_dropout: float | None = None
    pre_encoder_dropout: float | None = None
    # Conformer stochastic depth (NeMo's stochastic_depth_*): in training each block is
    # skipped with its own probability — from 0 before block `stochastic_depth_start`
    # (1-based), then rising linearly to `stochastic_depth` at the last block ("linear") or
    # equal to it ("uniform") — and a kept block's change is scaled by 1 / (1 - p).
    stochastic_depth: float = 0.0
    stochastic_depth_mode: str = "linear"
    stochastic_depth_start: int = 1
    # Recompute each block's activations in the backward pass instead of storing them
    # (less memory, one more forward of the encoder; dropout masks are replayed exactly).
    recompute: bool = False
    # Streaming Conformer: each encoder frame attends only to its chunk of `chunk_frames`
    # frames (40 ms each) and `left_chunks` chunks before it (-1: all), and the convolution
    # module sees no later chunk (conv_context). 0 = full context (not streamable). The
    # LSTM encoder is causal anyway.
    chunk_frames: int = 0
    left_chunks: int = -1
    # Dynamic chunk training (WeNet): each update trains with a random chunk size, full
    # context for half of the updates and 1..dynamic_chunks frames for the others, so one
    # model serves several latencies (decode with --chunk-frames N; chunk_frames is the
    # default). 0 = off. Needs chunk_frames > 0.
    dynamic_chunks: int = 0
    # Where the LayerNorm after the residual additions sits — "block" (the Conformer paper
    # and NeMo: at the end of every block), "encoder" (once, after the last block) or
    # "none". With "block" a small Conformer on the mini corpus stayed in the predictor-only
    # phase for most of its training (RESULTS.md).
    final_norm: str = "none"
    # Streaming Conformer: what its convolution module sees — "causal" (the kernel_size - 1
    # frames before) or "chunk" (the centred kernel up to the end of the frame's chunk: no
    # latency beyond the chunk's, which attention waits for anyway).
    conv_context: str = "chunk"
    # NeMo's causal_downsampling: the striding subsamplings' convolutions see no later frame
    # (padded kernel - 1 before, stride - 1 after, in time and frequency), so a stream is
    # subsampled as NeMo's cache-aware models do it. Needs subsampling striding/dw_striding.
    causal_subsampling: bool = False
    # A model trained with several look-aheads (NeMo's att_context_size list): each one's
    # right context in encoder frames, the chunk being look-ahead + 1 frames; the first is
    # the default (chunk_frames - 1), the left context stays left_chunks x chunk_frames
    # frames for all. Training draws one per update (every micro-batch of a window alike);
    # decoding picks one with --lookahead-frames. Empty: the model's chunk_frames only.
    lookaheads: tuple[int, ...] = ()

    @property
    def frames_per_output(self) -> int:
        """Feature frames per encoder frame."""
        return self.subsampling_factor

    def applicable_keys(self) -> tuple[str, ...]:
        """The keys this kind of encoder reads."""
        if self.kind == "lstm":
            return LSTM_ENCODER_KEYS
        skipped = {"lstm_units", "lstm_layers"}
        if not self.chunk_frames:
            skipped |= set(STREAMING_KEYS)
        if self.conv_norm == "layer":
            skipped.add("batch_norm_momentum")
        return tuple(f.name for f in dataclasses.fields(self) if f.name not in skipped)

    def not_applicable(self, key: str) -> str:
        """Why `key` is an error for this encoder, in words that say what to do."""
        if self.kind == "lstm":
            why = f"a Conformer setting; kind lstm reads {', '.join(LSTM_ENCODER_KEYS[1:])}"
        elif key in STREAMING_KEYS:
            why = "a streaming setting: it needs model.encoder.chunk_frames > 0"
        elif key == "batch_norm_momentum":
            why = "a BatchNorm setting: it needs model.encoder.conv_norm batch or frozen_batch"
        else:
            why = "an LSTM setting: it needs model.encoder.kind lstm"
        return f"model.encoder.{key} does not apply to this encoder ({why})"

    def __post_init__(self):
        object.__setattr__(self, "lookaheads", tuple(self.lookaheads))
        _one_of(self, "model.encoder", kind=ENCODERS, subsampling=SUBSAMPLINGS,
                attention=ATTENTIONS, final_norm=FINAL_NORMS, conv_norm=CONV_NORMS,
                conv_context=CONV_CONTEXTS)  # fmt: skip
        factor = self.subsampling_factor
        if factor < 2 or factor & (factor - 1):
            raise ValueError(
                f"model.encoder.subsampling_factor must be a power of 2 >= 2, got {factor}"
            )
        if self.subsampling == "valid" and factor != 4:
            raise ValueError(
                "model.encoder.subsampling_factor must be 4 with subsampling: valid (x8 and "
                f"more: subsampling striding or dw_striding), got {factor}"
            )
        _at_least(self, "model.encoder", d_model=1, num_blocks=1, num_heads=1, kernel_size=1,
                  subsampling_filters=1, lstm_units=1, lstm_layers=1, ff_expansion=1)  # fmt: skip
        _positive(self, "model.encoder", "norm_epsilon")
        if self.stochastic_depth_mode not in ("linear", "uniform"):
            raise ValueError("model.encoder.stochastic_depth_mode must be linear or uniform, got "
                             f"{self.stochastic_depth_mode!r}")  # fmt: skip
        if not 1 <= self.stochastic_depth_start <= self.num_blocks:
            raise ValueError(
                "model.encoder.stochastic_depth_start must be in [1, num_blocks], got "
                f"{self.stochastic_depth_start}"
            )
        for key in ("dropout", "attention_dropout", "pre_encoder_dropout", "stochastic_depth"):
            rate = getattr(self, key)
            if rate is not None and not 0 <= rate < 1:
                raise ValueError(f"model.encoder.{key} must be in [0, 1), got {rate}")
        if not 0 <= self.batch_norm_momentum < 1:
            raise ValueError(
                f"model.encoder.batch_norm_momentum must be in [0, 1), got "
                f"{self.batch_norm_momentum}"
            )
        if self.chunk_frames < 0 or self.left_chunks < -1:
            raise ValueError(
                "model.encoder.chunk_frames must be >= 0 (0: full context) and "
                f"model.encoder.left_chunks >= -1 (-1: all), got {self.chunk_frames} and "
                f"{self.left_chunks}"
            )
        if self.dynamic_chunks < 0:
            raise ValueError(
                f"model.encoder.dynamic_chunks must be >= 0, got {self.dynamic_chunks}"
            )
        if self.chunk_frames and self.subsampling != "valid" and not self.causal_subsampling:
            raise ValueError(
                "model.encoder.chunk_frames needs subsampling: valid, or a striding one with "
                "causal_subsampling: true (the centred striding subsamplings do not stream "
                f"piece by piece), got {self.subsampling!r}"
            )
        if self.causal_subsampling and self.subsampling == "valid":
            raise ValueError(
                "model.encoder.causal_subsampling needs subsampling striding or dw_striding "
                "(valid is causal already)"
            )
        if self.lookaheads and self.chunk_frames:  # (without chunks: not applicable)
            if self.lookaheads[0] != self.chunk_frames - 1 or min(self.lookaheads) < 0:
                raise ValueError(
                    "model.encoder.lookaheads: the first is the default and must be "
                    f"chunk_frames - 1 = {self.chunk_frames - 1}, all >= 0, got "
                    f"{list(self.lookaheads)}"
                )
            if self.dynamic_chunks:
                raise ValueError(
                    "model.encoder.lookaheads and dynamic_chunks are two ways of training "
                    "several chunk sizes: set one"
                )
        applicable = self.applicable_keys()
        for field in dataclasses.fields(self):
            if field.name not in applicable and getattr(self, field.name) != field.default:
                raise ValueError(self.not_applicable(field.name))


@dataclass(frozen=True)
class PredictorConfig:
    kind: str = "lstm"  # lstm | stateless (the last `context_size` labels, no recurrence)
    embed_dim: int = 128
    units: int = 320
    num_layers: int = 1  # lstm
    context_size: int = 2  # stateless
    dropout: float = 0.1
    # lstm: the blank's embedding is a constant zero vector (NeMo's RNNTDecoder, whose start
    # symbol is the blank); otherwise the start symbol's embedding is learned.
    blank_as_pad: bool = False

    def __post_init__(self):
        _one_of(self, "model.predictor", kind=PREDICTORS)
        _at_least(self, "model.predictor", embed_dim=1, units=1, num_layers=1, context_size=1)
        if not 0 <= self.dropout < 1:
            raise ValueError(f"model.predictor.dropout must be in [0, 1), got {self.dropout}")
        _refuse_other_kinds(self, "model.predictor", PREDICTOR_KEYS)


ADAPTER_KINDS = ("none", "lora", "linear")
# The linear layers LoRA adapts, by name: every Conformer block's attention projections
# (q, k and v, kept as one qkv kernel, and the output), its two feed-forwards' linears, its
# convolution module's pointwise linears; the joint's three linears.
LORA_TARGETS = ("attention", "feed_forward", "convolution", "joint")
LORA_KEYS = ("rank", "alpha", "targets")
LINEAR_ADAPTER_KEYS = ("dim",)


@dataclass(frozen=True)
class AdaptersConfig:
    """Parameter-efficient fine-tuning. `kind: lora` adds a low-rank update
    (alpha / rank) x A B to the kernel of every linear layer of `targets` (A: random, B:
    zeros, so training starts from the base network exactly); only A and B train, the
    base's weights stay as loaded and hold no optimizer state. Decoding and the export
    merge the update into the kernels (no cost at inference). `kind: linear` adds NeMo's
    linear adapter (a residual LayerNorm -> `dim` -> swish -> back bottleneck, its output
    layer at zeros) to each Conformer block's output; only the adapters train, and they
    stay layers of the network at inference."""

    kind: str = "none"  # none | lora | linear
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("attention", "feed_forward")
    dim: int = 32  # linear: the adapters' bottleneck (NeMo's tutorials: 32)

    def __post_init__(self):
        _one_of(self, "model.adapters", kind=ADAPTER_KINDS)
        _at_least(self, "model.adapters", rank=1, dim=1)
        _positive(self, "model.adapters", "alpha")
        object.__setattr__(self, "targets", tuple(self.targets))
        unknown = [t for t in self.targets if t not in LORA_TARGETS]
        if unknown or not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(
                f"model.adapters.targets must be distinct names from {list(LORA_TARGETS)}, "
                f"got {list(self.targets)}"
            )
        _refuse_other_kinds(self, "model.adapters", {"lora": LORA_KEYS,
                                                     "linear": LINEAR_ADAPTER_KEYS})  # fmt: skip


@dataclass(frozen=True)
class ModelConfig:
    """The network's architecture only (what inference builds); the loss is `LossConfig`."""

    encoder: EncoderConfig = EncoderConfig()
    predictor: PredictorConfig = PredictorConfig()
    joint_dim: int = 320
    joint_activation: str = "tanh"  # tanh | relu (NeMo's RNNTJoint default)
    # TDT (token-and-duration transducer): the frames an emission may skip; the joint then
    # also predicts one of them per emission. Empty: a plain RNN-T joint.
    durations: tuple[int, ...] = ()
    # torch's biases (NeMo's models): the joint's predictor projection has its own bias and
    # every LSTM layer of the predictor a second one on its input, as torch's Linear and
    # LSTM have. The same function as one bias each; AdamW moves the two separately, so an
    # imported model's update is NeMo's.
    torch_biases: bool = False
    # A CTC head on the encoder (a linear layer to the vocabulary, blank shared): trained
    # with loss.ctc_weight, decoded with `--method ctc` (a hybrid CTC/transducer model).
    ctc_head: bool = False
    # Fine-tuning through adapters: LoRA (decoded merged into the kernels) or linear adapters
    # (layers of the network).
    adapters: AdaptersConfig = AdaptersConfig()

    def __post_init__(self):
        _at_least(self, "model", joint_dim=1)
        _one_of(self, "model", joint_activation=JOINT_ACTIVATIONS)
        object.__setattr__(self, "durations", tuple(self.durations))
        if self.durations and (
            sorted(set(self.durations)) != list(self.durations) or self.durations[0] < 0
            or self.durations[-1] < 1
        ):  # fmt: skip
            raise ValueError(
                "model.durations must be increasing, >= 0, with at least one > 0 (e.g. "
                f"[0, 1, 2, 3, 4]), got {list(self.durations)}"
            )


@dataclass(frozen=True)
class LossConfig:
    """The training loss, owned by the training task (which builds any head it needs)."""

    # "full": the RNN-T loss over the whole lattice; "pruned": k2's pruned RNN-T — a
    # trivial-joiner "simple" loss picks a band of `prune_range` symbols per frame and the
    # full joint runs only there; "tdt": the token-and-duration transducer loss of a joint
    # with `model.durations` (see sigma and omega).
    kind: str = "full"  # full | pruned | tdt
    # What the window's summed loss is divided by, over all its micro-batches and replicas:
    # tokens | utterances | utterance_tokens (each utterance's loss over its own tokens,
    # then averaged over utterances).
    normalize_by: str = "tokens"
    # The joint's output layer fused with the loss, chunk by chunk (never the whole
    # [B, T, U+1, V]); false: logits first, then the loss (the reference path).
    fused: bool = True
    chunk_mb: float = 64.0  # budget for one fused chunk's float32 temporaries
    prune_range: int = 5
    simple_scale: float = 0.5  # the simple loss' weight after the warm-up; 1.0 at update 0
    warmup_updates: int = 2000  # simple 1 -> simple_scale, pruned 0.1 -> 1, in updates
    lm_only_scale: float = 0.25  # smoothing of the simple loss (icefall's defaults)
    am_only_scale: float = 0.0
    # With `fused`: the chunk budget of the pruned loss' band and simple-loss projection —
    # a band chunk costs little time, so chunks can be small (tools/bench_joint.py: 8 MiB
    # took 0.09 s more per Conformer-S step than 64, for ~90 MiB less peak memory).
    pruned_chunk_mb: float = 8.0
    # k2/icefall's delay penalty λ: a label emitted at frame t scores λ·((T−1)/2 − t) more,
    # so the model learns to emit earlier (word times, latency; at some WER). Full loss only.
    delay_penalty: float = 0.0
    # The CTC loss of the network's CTC head (model.ctc_head): each utterance's loss is its
    # transducer loss + ctc_weight × its CTC loss, or with ctc_interpolate (NeMo's hybrid
    # models) (1 − ctc_weight) × transducer + ctc_weight × CTC. 0 = the head is not trained.
    ctc_weight: float = 0.0
    ctc_interpolate: bool = False
    # What the CTC loss is divided by when it is not what the transducer's is (NeMo's
    # hybrids: aux_ctc.ctc_reduction beside rnnt_reduction; null: normalize_by): the
    # window's loss is then (its transducer sum / its normalize_by count) + (its CTC sum /
    # its ctc_normalize_by count), both counts over the whole window (exact under
    # accumulation: the engine totals them before the window's first backward pass).
    ctc_normalize_by: str | None = None
    # FastEmit (Yu et al. 2021, as NeMo computes it): the gradient of every label emission
    # is scaled by 1 + fastemit_lambda (blanks' are not), the loss reported is
    # (1 + fastemit_lambda) × −log P(y|x). Full RNN-T loss only.
    fastemit_lambda: float = 0.0
    # tdt: sigma is subtracted from every token log-prob (logit under-normalisation, the
    # paper's and NeMo's); with probability omega an update trains with the RNN-T loss of
    # the token logits instead (drawn per optimizer update).
    sigma: float = 0.0
    omega: float = 0.0

    def __post_init__(self):
        _at_least(self, "loss", prune_range=2, warmup_updates=0, sigma=0.0)
        if not 0 <= self.omega <= 1:
            raise ValueError(f"loss.omega must be in [0, 1], got {self.omega}")
        _one_of(self, "loss", kind=LOSSES)
        if self.ctc_weight < 0:
            raise ValueError(f"loss.ctc_weight must be >= 0, got {self.ctc_weight}")
        if self.ctc_normalize_by is not None:
            if self.ctc_normalize_by not in NORMALIZERS[:3]:
                raise ValueError(f"loss.ctc_normalize_by must be one of {NORMALIZERS[:3]} or "
                                 f"null, got {self.ctc_normalize_by!r}")  # fmt: skip
            if self.ctc_weight == 0:
                raise ValueError("loss.ctc_normalize_by divides the CTC loss: it needs "
                                 "loss.ctc_weight > 0")  # fmt: skip
        if self.ctc_interpolate and self.ctc_weight > 1:
            raise ValueError(
                f"loss.ctc_weight must be <= 1 with loss.ctc_interpolate, got {self.ctc_weight}"
            )
        if self.fastemit_lambda < 0:
            raise ValueError(f"loss.fastemit_lambda must be >= 0, got {self.fastemit_lambda}")
        if self.fastemit_lambda and self.kind != "full":
            raise ValueError(
                f"loss.fastemit_lambda works with loss.kind=full only (not with {self.kind!r})"
            )
        for key in ("simple_scale", "lm_only_scale", "am_only_scale"):
            if not 0 <= getattr(self, key) <= 1:
                raise ValueError(f"loss.{key} must be in [0, 1], got {getattr(self, key)}")
        if self.lm_only_scale + self.am_only_scale >= 1:
            raise ValueError("loss.lm_only_scale + loss.am_only_scale must be < 1")
        if self.delay_penalty < 0:
            raise ValueError(f"loss.delay_penalty must be >= 0, got {self.delay_penalty}")
        if self.delay_penalty and self.kind == "pruned":
            raise ValueError("loss.delay_penalty works with loss.kind=full only (not with pruned)")
        _positive(self, "loss", "chunk_mb", "pruned_chunk_mb")
        _one_of(self, "loss", normalize_by=NORMALIZERS)
        _refuse_other_kinds(self, "loss", LOSS_KEYS)


PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# What an inference encoder's weights and products can be in (`--precision`; `Transducer`).
ENCODER_PRECISIONS = ("float32", "bfloat16")
STRATEGIES = ("auto", "mirrored", "multiworker")
SCHEDULES = ("inverse_sqrt", "cosine")
OPTIMIZERS = ("adamw", "adafactor")


@dataclass(frozen=True)
class DataConfig:
    train_shards: str = "shards/train"  # directory of *.tfrecord from `asrkit features extract`
    dev_shards: str | None = "shards/dev"
    tokenizer: str = "tokenizer"  # directory from `asrkit tokenizer train`
    cmvn: str | None = None  # JSON from `asrkit features cmvn`
    batch_seconds: float = 60.0  # audio per micro-batch, padding included
    num_buckets: int = 8
    spec_augment: bool = True
    # SpecAugment's masks per training utterance (NeMo's spectrogram augmentation names in
    # brackets): spec_freq_masks bands of at most spec_freq_width mel bins (freq_masks,
    # freq_width), spec_time_masks spans of at most spec_time_width of the utterance
    # (time_masks, time_width as a fraction), or of spec_time_frames frames when > 0
    # (time_width as a frame count).
    spec_freq_masks: int = 2
    spec_freq_width: int = 27
    spec_time_masks: int = 2
    spec_time_width: float = 0.05
    spec_time_frames: int = 0
    # Per-utterance warp of the mel axis by a factor in [1 - w, 1 + w]: unseen voices
    # (vocal tract lengths) for free; 0 turns it off. Training only.
    freq_warp: float = 0.0
    label_pad_multiple: int = 8  # pad U to a multiple: fewer distinct shapes to compile
    # A memory plan from `asrkit plan`: its measured micro-batch per bucket replaces
    # batch_seconds (and effective_batch_seconds is reached with its mean micro-batch).
    plan: str | None = None

    def __post_init__(self):
        _positive(self, "data", "batch_seconds")
        _at_least(self, "data", num_buckets=1, label_pad_multiple=1, spec_freq_masks=0,
                  spec_freq_width=0, spec_time_masks=0, spec_time_frames=0)  # fmt: skip
        if not 0 <= self.spec_time_width <= 1:
            raise ValueError(
                f"data.spec_time_width must be in [0, 1] (a fraction of the utterance), got "
                f"{self.spec_time_width}"
            )
        if not 0 <= self.freq_warp < 0.5:
            raise ValueError(f"data.freq_warp must be in [0, 0.5), got {self.freq_warp}")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 10
    accumulation_steps: int = 1
    effective_batch_seconds: float | None = None  # if set, derives accumulation_steps
    learning_rate: float = 1e-3  # peak, reached after the warm-up
    warmup_updates: int = 500  # counted in optimizer updates, not micro-batches
    # after the warm-up: "inverse_sqrt" (Noam) or "cosine" (to final_lr_ratio x peak at the
    # last update of the last epoch)
    schedule: str = "inverse_sqrt"
    final_lr_ratio: float = 0.0
    weight_decay: float = 1e-3
    # "adamw" (two float32 slots per weight) or "adafactor" (factored second moments only:
    # a few bytes per row and column; the state of a 0.6 B model drops from 4.8 GB to MBs)
    optimizer: str = "adamw"
    # AdamW's (torch's formula): β₁, β₂ and ε (NeMo's templates: 0.9, 0.98, 1e-8)
    adam_beta_1: float = 0.9
    adam_beta_2: float = 0.999
    adam_epsilon: float = 1e-8
    clip_global_norm: float | None = 5.0
    precision: str = "float32"
    strategy: str = "auto"
    seed: int = 0
    checkpoint_every: int = 200  # updates
    keep_checkpoints: int = 3
    # Besides the newest keep_checkpoints: the N epoch-end checkpoints with the lowest dev
    # WER (needs data.dev_shards); `asrkit average --best N` averages them.
    keep_best: int = 0
    jit_compile: bool = False
    max_consecutive_skips: int = 25
    freeze_encoder: int = 0  # fine-tuning: 0 none, -1 the whole encoder, n its first n layers
    # Fine-tuning through model.adapters: network weights that train in full beside the
    # adapters, by their checkpoint names or a prefix of them (e.g. a new vocabulary's
    # [joint.output_layer, predictor.embedding, ctc_head]).
    trainable: tuple[str, ...] = ()
    probe_memory: bool = True  # one pass on the largest micro-batch before training starts

    def __post_init__(self):
        object.__setattr__(self, "trainable", tuple(self.trainable))
        _at_least(self, "train", epochs=1, accumulation_steps=1, warmup_updates=0,
                  checkpoint_every=0, keep_checkpoints=1, keep_best=0, max_consecutive_skips=0,
                  freeze_encoder=-1)  # fmt: skip
        _positive(self, "train", "effective_batch_seconds", "learning_rate", "clip_global_norm")
        _at_least(self, "train", weight_decay=0.0, final_lr_ratio=0.0)
        for key in ("adam_beta_1", "adam_beta_2"):
            if not 0 <= getattr(self, key) < 1:
                raise ValueError(f"train.{key} must be in [0, 1), got {getattr(self, key)}")
        _positive(self, "train", "adam_epsilon")
        if self.precision not in PRECISIONS:
            raise ValueError(f"train.precision must be one of {PRECISIONS}: {self.precision!r}")
        _one_of(self, "train", schedule=SCHEDULES, strategy=STRATEGIES, optimizer=OPTIMIZERS)


DECODE_METHODS = ("greedy", "beam", "ctc")


@dataclass(frozen=True)
class DecodeConfig:
    """The decoding settings, one config for every search (`DecodeOptions` in
    `asrkit.decoding`): the method and its beam, the symbols per frame and the fusion
    weights. An experiment's symbols per frame and fusion weights are what its commands
    decode with unless a flag says otherwise; their method and beam come from the flags
    (`--method`, `--beam`; greedy, beam 4), the dev WER's search is greedy."""

    method: str = "greedy"  # greedy | beam | ctc (greedy on a hybrid network's CTC head)
    beam: int = 4  # hypotheses kept per utterance (beam search)
    max_symbols_per_step: int = 3  # per encoder frame; 1 = k2's modified beam search
    # word boosting (`--boost`): bonus per piece of a phrase, in nats, where its line gives
    # none (2.0, icefall's default, over-boosted the mini recipe's model)
    boost_weight: float = 1.0
    # n-gram LM shallow fusion (`--lm`): the LM's log-probabilities times lm_weight; with
    # `--lodr`, a low-order LM of the training transcripts times -lodr_weight (both the best
    # on the mini recipe's dev set, beam 4, two seeds: RESULTS.md)
    lm_weight: float = 0.2
    lodr_weight: float = 0.2

    def __post_init__(self):
        _one_of(self, "decode", method=DECODE_METHODS)
        _at_least(self, "decode", beam=1, max_symbols_per_step=1)
        _at_least(self, "decode", boost_weight=0, lm_weight=0, lodr_weight=0)


# The version of the config schema (and of the checkpoints' state.json). A recorded
# experiment of another version is refused by name rather than read with other meanings.
SCHEMA_VERSION = 2


@dataclass(frozen=True)
class ExperimentConfig:
    schema: int = SCHEMA_VERSION
    model: ModelConfig = ModelConfig()
    loss: LossConfig = LossConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    features: FeatureConfig = FeatureConfig()
    decode: DecodeConfig = DecodeConfig()

    def __post_init__(self):
        tdt_model, tdt_loss = bool(self.model.durations), self.loss.kind == "tdt"
        if tdt_model != tdt_loss:
            raise ValueError(
                "a TDT model (model.durations) trains with loss.kind: tdt, and loss.kind: tdt "
                f"needs model.durations; got model.durations {list(self.model.durations)} "
                f"with loss.kind {self.loss.kind!r}"
            )
        if self.loss.ctc_weight > 0 and not self.model.ctc_head:
            raise ValueError(
                f"loss.ctc_weight {self.loss.ctc_weight} trains the CTC head: set "
                "model.ctc_head: true (or loss.ctc_weight: 0)"
            )
        if self.train.trainable and self.model.adapters.kind == "none":
            raise ValueError(
                f"train.trainable {list(self.train.trainable)} names what trains beside "
                "model.adapters, and there are none: set model.adapters.kind (e.g. lora), or "
                "drop train.trainable (without adapters every weight trains)"
            )
        if self.train.keep_best and not self.data.dev_shards:
            raise ValueError(
                "train.keep_best ranks checkpoints by dev WER: it needs data.dev_shards"
            )
        if self.schema != SCHEMA_VERSION:
            raise ValueError(
                f"schema {self.schema}: this asrkit reads config schema {SCHEMA_VERSION} (the "
                "experiment was recorded by another asrkit; use that one, or train anew)"
            )


class ConfigError(UserError, ValueError):
    """A configuration that cannot be used; the message names the key and section."""


def build_config(cls, data: dict, section: str = ""):
    """A frozen dataclass from a dict, strictly: unknown keys and wrong types are errors."""
    if not isinstance(data, dict):
        raise ConfigError(f"section '{section or 'top level'}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    data = dict(data)
    for key in list(data):
        if key not in names:
            where = f"section '{section}'" if section else "the top level"
            raise ConfigError(f"unknown key '{key}' in {where} (known: {sorted(names)})")
    values = {}
    for key, value in data.items():
        kind = hints[key]
        path = f"{section}.{key}" if section else key
        if dataclasses.is_dataclass(kind):
            values[key] = build_config(kind, value, path)
        else:
            values[key] = _check_type(value, kind, path)
    try:
        built = cls(**values)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    # A section whose keys depend on its kind (model.encoder) refuses a key of another
    # kind even at its default value.
    if hasattr(built, "applicable_keys"):
        for key in data:
            if key not in built.applicable_keys():
                raise ConfigError(built.not_applicable(key))
    return built


_EXPONENT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")


def _check_type(value, kind, path):
    if typing.get_origin(kind) is tuple:  # tuple[int, ...]: a YAML list of ints
        item = typing.get_args(kind)[0]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"'{path}' must be a list of {item.__name__}, got {value!r}")
        return tuple(_check_type(v, item, f"{path}[{i}]") for i, v in enumerate(value))
    union = typing.get_origin(kind) in (typing.Union, types.UnionType)
    allowed = typing.get_args(kind) if union else (kind,)
    if value is None and type(None) in allowed:
        return None
    for t in allowed:
        if t is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if t is float and isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t in (str, bool) and isinstance(value, t):
            return value
    names = " or ".join(getattr(t, "__name__", str(t)) for t in allowed)
    raise ConfigError(f"'{path}' must be {names}, got {value!r}")


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """`a.b=c` assignments (values parsed as YAML) applied to a nested dict copy."""
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects key.path=value, got {item!r}")
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: '{part}' is not a section")
        node[parts[-1]] = yaml.safe_load(raw)
    return data


def load_config(path: str | os.PathLike | None, overrides: list[str] = ()) -> ExperimentConfig:
    """A YAML config (its `base:`, if any, first), then `--set` overrides."""
    return config_from_data(read_config_data(path) if path is not None else {}, overrides, path)


def read_config_data(path: str | os.PathLike) -> dict:
    """A config file's mapping as read, its `base:` chain merged in (`ConfigError` for a
    YAML error)."""
    return _read_yaml(Path(path))


def config_from_data(data: dict, overrides: list[str] = (), path=None) -> ExperimentConfig:
    """The config of a mapping `read_config_data` read from `path`, then `--set` overrides."""
    for item in overrides:
        _check_override_key(item)
    try:
        build_config(ExperimentConfig, data)
    except ConfigError as err:  # the file's own fault, whatever --set says
        raise ConfigError(f"{path}: {err}") from None
    try:
        return build_config(ExperimentConfig, apply_overrides(data, list(overrides)))
    except ConfigError as err:
        raise ConfigError(f"--set: {err}") from None


def _check_override_key(item: str) -> None:
    """`--set a.b=c` names a key of the config schema (else: one error naming `--set`, with
    the nearest known key)."""
    key, sep, _ = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set expects key.path=value, got {item!r}")
    cls, walked = ExperimentConfig, []
    for part in key.split("."):
        if not dataclasses.is_dataclass(cls):
            raise ConfigError(f"--set {item}: '{'.'.join(walked)}' is a value, not a section")
        hints = typing.get_type_hints(cls)
        if part not in hints:
            where = f"section '{'.'.join(walked)}'" if walked else "the top level"
            near = difflib.get_close_matches(part, list(hints), n=1)
            hint = f"; did you mean '{'.'.join([*walked, near[0]])}'?" if near else ""
            raise ConfigError(
                f"--set {item}: unknown key '{part}' in {where}{hint} (known: {sorted(hints)})"
            )
        cls = hints[part]
        walked.append(part)


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A config file's mapping. `base: other.yaml` (relative to this file) names a config
    this one starts from: its values, then this file's, merged section by section."""
    if path.resolve() in seen:
        raise ConfigError(f"{path}: its base: chain comes back to itself")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such config file") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: {yaml_problem(err)}") from None
    if not isinstance(data, dict) or "base" not in data:
        return data
    base = data.pop("base")
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base must be a config file's path, got {base!r}")
    return _merged(_read_yaml(path.parent / base, (*seen, path.resolve())), data)


def yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML syntax error in one line: where (line and column, 1-based) and what."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    return f"not valid YAML: {where}{problem}" + (f" ({context})" if context else "")


def _merged(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def dump_config(config: ExperimentConfig) -> str:
    """The config as YAML, with only the encoder keys its kind reads."""
    data = dataclasses.asdict(config)
    keys = config.model.encoder.applicable_keys()
    data["model"]["encoder"] = {k: v for k, v in data["model"]["encoder"].items() if k in keys}
    return yaml.safe_dump(data, sort_keys=False)
