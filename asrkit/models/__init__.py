"""Models: the transducer network (subsampling, Conformer and LSTM encoders, predictor,
joint) as plain Keras layers. Models never import data, decoding or training: the
training task that wraps the network lives in `asrkit.training.task`."""
