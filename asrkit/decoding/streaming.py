"""Streaming recognition: audio arrives in pieces of any size, tokens leave as soon as the
encoder frames that emit them exist.

One stream's state is explicit (`StreamState`), so a server can keep many streams and an
export can pass it in and out: the waveform not yet in a whole feature frame (< 25 ms), the
normalised feature frames the subsampling still needs (< 7), each encoder layer's recurrent
state, the greedy search's predictor output and state, the encoder frames decoded so far and
every token found so far with its frame. Nothing is recomputed: feature frames, encoder
frames and the search depend only on what came before them (and, for a chunked Conformer, on
the rest of their chunk), so feeding a waveform in any pieces, then `finish` (the last,
partial chunk), finds exactly the tokens (and frames) greedy search finds on the whole
waveform (tested). With `beam` > 1 the state carries modified beam search's hypotheses
instead, and the stream ends with exactly the hypotheses beam search keeps on the whole
waveform (tested); its text so far is the best hypothesis so far, which a later frame can
revise. With word boosting or an LM (`boost` tables) the carry also holds each hypothesis's
automata states, and the stream finds what the boosted search finds on the whole waveform
(tested). A TDT model streams with its greedy search: a duration that jumps past the frames
encoded so far goes on into the next piece's. That needs an encoder that streams: the LSTM
encoder (causal), or a Conformer trained with chunks (`model.encoder.chunk_frames`); a
full-context Conformer attends to the whole utterance.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from asrkit.config import DecodeConfig, FeatureConfig
from asrkit.decoding.fusion.steps import as_tensors, start_states
from asrkit.decoding.search.beam import Beams, beam_continue, beam_found, beam_start, taken_back
from asrkit.decoding.search.front import GREEDY_STREAM_STEPS
from asrkit.decoding.search.strategies import check
from asrkit.decoding.words import SUBSAMPLING
from asrkit.errors import UserError
from asrkit.features import encoder_frames, front_end

SYMBOLS = DecodeConfig.max_symbols_per_step  # the config's default, defined there once


class StreamState(NamedTuple):
    samples: tf.Tensor  # [S] float32, S < frame_length: waveform not yet in a feature frame
    features: tf.Tensor  # [F, mel]: normalised frames from 4 × `frames` on
    encoder: list  # the encoder's recurrent state, [batch 1]
    # greedy: (predictor output, predictor state[, TDT: frames to skip][, automata
    # states]), [batch 1]; beam: `Beams` of one stream (with fusion tables: (Beams, states))
    carry: tuple
    frames: tf.Tensor  # scalar int32: encoder frames decoded so far
    tokens: tf.Tensor  # [N] int32: every token so far (beam: of the best hypothesis)
    token_frames: tf.Tensor  # [N] int32: the encoder frame each was emitted at
    token_log_probs: tf.Tensor  # [N] float32: each token's log-posterior where emitted
    score: tf.Tensor  # scalar float32: Σ log-probs of every decision so far (beam: of the best)


class StreamStep(NamedTuple):
    # greedy: the tokens this piece of audio added; beam: the best hypothesis so far
    tokens: tf.Tensor  # [n] int32
    token_frames: tf.Tensor  # [n] int32
    state: StreamState


class StreamingDecoder:
    """`decoder.step(samples, state)` for one stream; `decoder.initial_state()` to start.
    `beam` 1 searches greedily; more keeps that many hypotheses (modified beam search)."""

    def __init__(self, network, features: FeatureConfig, normalize=None,
                 max_symbols_per_step: int = SYMBOLS, beam: int = 1, boost=None,
                 feature_dtype=tf.float64):  # fmt: skip
        if not network.encoder.streams:
            raise UserError(
                "streaming needs an encoder that streams: model.encoder.kind=lstm, or a "
                "Conformer trained with model.encoder.chunk_frames > 0; this model's "
                f"{type(network.encoder).__name__} attends to the whole utterance"
            )
        method = "beam" if int(beam) > 1 else "greedy"
        found = check(method, network.config, streaming=True)  # the strategy table's refusal
        self.greedy_steps = GREEDY_STREAM_STEPS.get((found.decoder, found.method))
        self.front_end = front_end(features)
        self.front_end.check_streams()
        self.network, self.features, self.normalize = network, features, normalize
        self.feature_dtype = feature_dtype  # NeMo's spectrum's (LiteRT: float32)
        self.max_symbols_per_step, self.beam = max_symbols_per_step, int(beam)
        # word boosting (`asrkit.decoding.fusion.boosting`): the carry then also holds the state
        self.boost = None if boost is None else as_tensors(boost)
        if self.beam < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        self.state_spec = self._state_spec()
        # One signature for every call: each step and the finish trace once per decoder,
        # whatever the pieces' sizes and however far the stream has come.
        self._compiled = tf.function(
            self._step, input_signature=[tf.TensorSpec([None], tf.float32), self.state_spec],
            autograph=False,
        )  # fmt: skip
        self._compiled_finish = tf.function(
            self._finish, input_signature=[self.state_spec], autograph=False
        )

    def _state_spec(self) -> StreamState:
        """The shapes a state can take: an axis that starts empty grows (or shrinks) as
        audio comes, the others keep their size; the samples held are any number (for
        NeMo's features they start as the zeros before the stream's first frame)."""
        template = self.initial_state()
        flat = tf.nest.flatten(template)
        open_axes = [[d == 0 for d in t.shape] for t in flat]
        open_axes[0] = [True]  # StreamState.samples
        specs = [
            tf.TensorSpec([None if o else d for d, o in zip(t.shape, axes, strict=True)], t.dtype)
            for t, axes in zip(flat, open_axes, strict=True)
        ]
        return tf.nest.pack_sequence_as(template, specs)

    def initial_state(self) -> StreamState:
        return StreamState(
            samples=tf.zeros([self.front_end.samples_before], tf.float32),
            features=tf.zeros([0, self.features.num_mel_bins], tf.float32),
            encoder=self.network.encoder.initial_stream_state(1),
            carry=self._start(),
            frames=tf.constant(0, tf.int32),
            tokens=tf.zeros([0], tf.int32),
            token_frames=tf.zeros([0], tf.int32),
            token_log_probs=tf.zeros([0], tf.float32),
            score=tf.constant(0.0),
        )

    def _start(self):
        if self.beam > 1:
            beams = beam_start(self.network, 1, self.beam)
            return (
                beams if self.boost is None else (beams, start_states(self.boost, [1, self.beam]))
            )
        start, _ = self.greedy_steps
        carry = start(self.network, 1)
        return carry if self.boost is None else (*carry, start_states(self.boost, [1]))

    def step(self, samples, state: StreamState) -> StreamStep:
        """samples [n] float32 (any n, 0 included) -> the tokens they complete."""
        return self._compiled(tf.convert_to_tensor(samples, tf.float32), state)

    def _step(self, samples, state: StreamState) -> StreamStep:
        samples = tf.concat([state.samples, tf.cast(samples, tf.float32)], axis=0)
        mel, used_samples = self.front_end.stream(samples, self.feature_dtype)
        if self.normalize is not None:
            mel = self.normalize(mel)
        encoder = self.network.encoder
        features = tf.concat([state.features, mel], axis=0)
        encoded, encoder_state = encoder.stream(tf.expand_dims(features, 0), state.encoder)
        if encoder.keeps_features:  # each frame passed once: none waits here
            used = tf.shape(features)[0]
        else:
            used = SUBSAMPLING * encoder_frames(tf.shape(features)[0])  # the rest waits
        return self._search(encoded, state._replace(
            samples=samples[used_samples:], features=features[used:], encoder=encoder_state,
        ))  # fmt: skip

    def finish(self, state: StreamState) -> StreamStep:
        """The end of the stream: the tokens of frames still waiting for their chunk."""
        return self._compiled_finish(state)

    def _finish(self, state: StreamState) -> StreamStep:
        encoder = self.network.encoder
        before = None
        last = self.front_end.stream_end(state.samples, encoder.keeps_features,
                                         self.feature_dtype)  # fmt: skip
        if last is not None:
            mel = tf.concat([state.features, last], axis=0)
            before, encoder_state = encoder.stream(mel[None], state.encoder)
            state = state._replace(samples=state.samples[:0], encoder=encoder_state,
                                   features=state.features[:0])  # fmt: skip
        encoded, encoder_state = encoder.finish_stream(state.encoder)
        if before is not None:
            encoded = tf.concat([before, encoded], axis=1)
        return self._search(encoded, state._replace(encoder=encoder_state), last=True)

    def _search(self, encoded, state: StreamState, last: bool = False) -> StreamStep:
        """The search over the newly encoded frames, from the state's carry (`last`: the
        stream's end, where open word-boosting matches are taken back)."""
        encoded = tf.reshape(encoded, [1, -1, encoded.shape[-1]])  # one stream, known
        ready = tf.shape(encoded)[1]
        if self.beam > 1:
            return self._beam_search(encoded, ready, state, last)
        _, search = self.greedy_steps
        found, carry = search(
            self.network, encoded, ready[None], state.carry, self.max_symbols_per_step,
            first_frame=state.frames, boost=self.boost,
        )  # fmt: skip
        count = found.counts[0]
        new_tokens, new_frames = found.tokens[0, :count], found.frames[0, :count]
        new_log_probs = found.token_log_probs[0, :count]
        return StreamStep(
            new_tokens,
            new_frames,
            state._replace(
                carry=carry,
                frames=state.frames + ready,
                tokens=tf.concat([state.tokens, new_tokens], axis=0),
                token_frames=tf.concat([state.token_frames, new_frames], axis=0),
                token_log_probs=tf.concat([state.token_log_probs, new_log_probs], axis=0),
                score=state.score + found.scores[0],
            ),
        )

    def _beam_search(self, encoded, ready, state: StreamState, last: bool) -> StreamStep:
        if self.boost is None:
            beams = beam_continue(
                self.network, encoded, ready[None], Beams(*state.carry),
                self.max_symbols_per_step, first_frame=state.frames,
            )  # fmt: skip
        else:
            beams, where = beam_continue(
                self.network, encoded, ready[None], Beams(*state.carry[0]),
                self.max_symbols_per_step, first_frame=state.frames,
                boost=(self.boost, state.carry[1]),
            )  # fmt: skip
        room = tf.reduce_max(beams.counts)  # token slots beyond every count stay free
        beams = beams._replace(
            tokens=beams.tokens[:, :, :room], frames=beams.frames[:, :, :room],
            log_probs=beams.log_probs[:, :, :room],
        )  # fmt: skip
        ranked = taken_back(beams, self.boost, where) if self.boost is not None and last else beams
        best = beam_found(ranked)
        count = best.counts[0, 0]
        tokens, frames = best.tokens[0, 0, :count], best.frames[0, 0, :count]
        return StreamStep(
            tokens,
            frames,
            state._replace(
                carry=beams if self.boost is None else (beams, where),
                frames=state.frames + ready,
                tokens=tokens,
                token_frames=frames,
                token_log_probs=best.token_log_probs[0, 0, :count],
                score=best.scores[0, 0],
            ),
        )
