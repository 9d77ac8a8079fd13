"""Importers of models trained elsewhere (NeMo's .nemo files): reading their archives and
PyTorch checkpoints safely, without torch, into asrkit experiments."""
