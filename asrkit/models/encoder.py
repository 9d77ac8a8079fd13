"""What every encoder offers its callers (the transducer, training, streaming): encoding
with lengths, its blocks in order (for freezing and recomputation) and, where it can, a
stream state."""

from __future__ import annotations

from asrkit.models.layers import CompositeLayer


class Encoder(CompositeLayer):
    """features [B, T, F], feature_lengths [B] -> (encoder frames [B, T', D], encoder_lengths).

    Subclasses hold `subsampling` (the first layer) and `blocks` (the layers after it, in
    order: what freezing the first n and recomputation act on), and define `output_dim`;
    one that `streams` also defines `initial_stream_state`, `stream` and `finish_stream`."""

    @property
    def output_dim(self) -> int:
        raise NotImplementedError

    @property
    def streams(self) -> bool:
        """Can an utterance be encoded piece by piece, each piece's frames final?"""
        return False

    @property
    def keeps_features(self) -> bool:
        """Does the stream state hold the features the encoder still needs (then a caller
        passes each feature frame once), or does the caller keep them?"""
        return False

    def initial_stream_state(self, batch_size):
        raise NotImplementedError(f"{type(self).__name__} does not stream")

    def stream(self, features, state):
        """The next feature frames of streams encoded up to here -> (the encoder frames now
        final, the new state)."""
        raise NotImplementedError(f"{type(self).__name__} does not stream")

    def finish_stream(self, state):
        """The end of the streams: the encoder frames still waiting."""
        raise NotImplementedError(f"{type(self).__name__} does not stream")
