"""Models: the transducer network (subsampling, one Conformer encoder whose variants —
asrkit's and NeMo's — are options, the LSTM encoder, predictors, the RNN-T or TDT joint) as
plain Keras layers. Models never import data, decoding or training: the training task that
wraps the network lives in `asrkit.training.task`."""
