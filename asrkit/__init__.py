"""asrkit: RNN-Transducer speech recognition training on TensorFlow 2 / Keras 3.

Dependency direction — each layer imports only the layers below it (checked by
`tests/test_architecture.py` over the parsed imports):

    cli
    training                 the task (loss + accumulation engine), train loop, verify, plan
    export                   SavedModel of a loaded experiment
    decoding, importers      greedy / beam search, decoding test sets; reading .nemo files
    experiment               an experiment directory, loaded for inference
    checkpoints              checkpoint I/O
    models, losses, data     the transducer network; its losses; manifests, corpora,
                             shards, the tf.data pipeline (peers: none imports another)
    features                 log-mel, frame arithmetic, CMVN statistics
    audio, tokenizer, metrics
    config, progress, outputs
    errors, sizes

Models never import data or training; nothing imports cli. Importing asrkit has no side
effects: no environment variables, logging configuration or device probing happen here.
"""

__version__ = "0.3.0"
