"""Models: subsampling, encoders (Conformer, LSTM), predictor, joint, and the Transducer.

Models never import data or training (the Transducer's base class comes from
`asrkit.training.accumulation`, the engine every trainable model shares).
"""
