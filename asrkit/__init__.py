"""asrkit: RNN-Transducer speech recognition training on TensorFlow 2 / Keras 3.

Dependency direction (arrows point from the importer to what it may import):

    config   <- features, tokenizer <- data
    models   <- losses
    data, models, losses, decoding <- training
    everything <- cli

Models never import data or training; nothing imports cli. Importing asrkit has no side
effects: no environment variables, logging configuration or device probing happen here.
"""

__version__ = "0.1.0"
