"""Arguments several subcommands share: which weights to load and which search to run."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_weights_arguments(parser) -> None:
    """--checkpoint DIR or --average N (the last N checkpoints; 1: the latest)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--checkpoint", help="checkpoint directory (default: the latest)")
    group.add_argument("--average", type=int, default=1, metavar="N",
                       help="average the last N checkpoints")  # fmt: skip


def add_precision_argument(parser) -> None:
    """--precision: what the encoder runs in (whole recordings; not streaming, not exports)."""
    from asrkit.config import ENCODER_PRECISIONS

    parser.add_argument(
        "--precision", choices=ENCODER_PRECISIONS, default="float32",
        help="the encoder's weights and products: bfloat16 runs its matrix products on the "
             "cores' bfloat16 units (AMX, AVX512-BF16: faster; without them slower) and "
             "moves its frames by 1-3 %% (tested; a TDT search strays more: compare dev "
             "WERs first); the predictor, joint and search stay float32",
    )  # fmt: skip


def add_search_arguments(parser, help: str | None = None) -> None:
    parser.add_argument("--method", choices=("greedy", "beam", "ctc"), default="greedy",
                        help=help or "greedy or beam search, or greedy CTC search (a hybrid "
                        "model's CTC head)")  # fmt: skip
    parser.add_argument("--beam", type=int, default=4, help="beam size (--method beam)")


def add_fusion_arguments(parser) -> None:
    """Word boosting and n-gram LM fusion (greedy and beam search)."""
    parser.add_argument("--boost", metavar="FILE",
                        help="word boosting: a phrase per line, or phrase<TAB>weight "
                        "(greedy and beam search)")  # fmt: skip
    parser.add_argument("--boost-weight", type=float, metavar="W",
                        help="bonus per piece of a boosted phrase, in nats, where its line "
                        "gives none (default: the experiment's decode.boost_weight)")  # fmt: skip
    parser.add_argument("--lm", metavar="ARPA",
                        help="shallow fusion of an n-gram LM over the model's pieces (ARPA, "
                        "plain or .gz; `asrkit lm train` makes one); best with --method "
                        "beam")  # fmt: skip
    parser.add_argument(
        "--lm-weight",
        type=float,
        metavar="W",
        help="the LM's log-probabilities times W (default: decode.lm_weight)",
    )
    parser.add_argument("--lodr", metavar="ARPA",
                        help="a low-order LM of the training transcripts, subtracted "
                        "(LODR: the model's internal LM not counted twice)")  # fmt: skip
    parser.add_argument("--lodr-weight", type=float, metavar="W",
                        help="the low-order LM's log-probabilities times -W (default: "
                        "decode.lodr_weight)")  # fmt: skip


def fusion_spec(args: argparse.Namespace):
    """The fusion (`--boost`, `--lm`, `--lodr` and their weights) the arguments ask for."""
    from asrkit.decoding.fusion.spec import FUSIONS, FusionSpec

    given = {}
    for name in FUSIONS:
        given[name] = getattr(args, name, None)
        given[f"{name}_weight"] = getattr(args, f"{name}_weight", None)
    return FusionSpec(**given)


def check_search_arguments(args: argparse.Namespace):
    """The search options' own mistakes, before any model loads: a beam below 1, an
    n-best list from greedy search (which finds one hypothesis), and the fusion options',
    whose files are read here, once. Returns them read (`ReadFusion`)."""
    from asrkit.decoding.fusion.spec import read_fusion
    from asrkit.errors import InputError

    if args.beam < 1:
        raise InputError(f"--beam must be >= 1, got {args.beam}")
    fusion = read_fusion(fusion_spec(args), args.method)
    if not getattr(args, "model", None):  # an export's own search answers for it
        from asrkit.decoding.search.strategies import check

        check(args.method, nbest=getattr(args, "nbest", 0), beam=args.beam)
    return fusion


def search_options(args: argparse.Namespace, config):
    """The experiment's decoding config (`config`: its ExperimentConfig) with the search the
    arguments ask for; `--method ctc` is refused for a model without a CTC head before it
    loads."""
    import dataclasses

    from asrkit.decoding.search.strategies import check
    from asrkit.errors import InputError

    if args.beam < 1:
        raise InputError(f"--beam must be >= 1, got {args.beam}")
    check(args.method, config.model)
    return dataclasses.replace(config.decode, method=args.method, beam=args.beam)


def check_before_loading(args: argparse.Namespace, config, fusion=None) -> None:
    """What an experiment's recorded config and tokenizer answer before TensorFlow and the
    model load: the search method against its network, `--precision` against its encoder,
    `--chunk-frames`/`--lookahead-frames` against its training, and `fusion`'s LMs (a
    ReadFusion) against its pieces."""
    from asrkit.decoding.search.strategies import check
    from asrkit.errors import InputError
    from asrkit.experiment import check_chunk_override

    check(args.method, config.model, streaming=getattr(args, "streaming", False))
    precision, encoder = getattr(args, "precision", "float32"), config.model.encoder.kind
    if precision != "float32" and encoder != "conformer":
        raise InputError(
            f"--precision {precision}: runs a Conformer encoder; this model's is {encoder} "
            "(decode it in float32)"
        )
    if getattr(args, "chunk_frames", None) is not None:
        check_chunk_override(config, args.chunk_frames)
    if fusion is not None and fusion.lms:
        from asrkit.tokenizer import Tokenizer

        tokenizer = Tokenizer.load(config.data.tokenizer)
        pieces = [tokenizer.piece(i) for i in range(tokenizer.vocab_size)]
        fusion.check_pieces(pieces, config.features.lm_tokens_by_id)


def experiment_or_config(
    config: str | None, exp_dir: str, overrides: list[str], new_from_defaults: bool = False
):
    """The config a command that trains or plans into `exp_dir` works with: `config` if
    given; else, for an existing experiment, the config it recorded (its tokenizer, CMVN
    and plan inside it; a path given in `overrides` is this directory's). A new
    experiment needs `config`, unless `new_from_defaults` (the built-in defaults)."""
    from asrkit.config import load_config
    from asrkit.errors import InputError
    from asrkit.experiment import CONFIG_FILE, load_experiment_config

    recorded = Path(exp_dir) / CONFIG_FILE
    if config is not None and Path(config).resolve() == recorded.resolve():
        config = None  # the experiment's own record: its paths are relative to it
    if config is None and not recorded.is_file() and new_from_defaults:
        return load_config(None, overrides)
    if config is None:
        if not recorded.is_file():
            raise InputError(
                f"--exp-dir {exp_dir}: not an experiment yet (no {CONFIG_FILE}); give the "
                "model and data to use with --config CONF"
            )
        return load_experiment_config(exp_dir, [_absolute_asset(o) for o in overrides])
    return load_config(config, overrides)


def _absolute_asset(override: str) -> str:
    key, sep, value = override.partition("=")
    if sep and value and key.strip() in ("data.tokenizer", "data.cmvn", "data.plan"):
        return f"{key}={Path(value).resolve()}"
    return override


class _Lookahead(argparse.Action):
    """--lookahead-frames R: chunks of R + 1 frames (the chunk's first frame waits R)."""

    def __call__(self, parser, namespace, value, option_string=None):
        namespace.chunk_frames = value + 1


def add_chunk_argument(parser) -> None:
    chunks = parser.add_mutually_exclusive_group()
    chunks.add_argument(
        "--chunk-frames", type=int, metavar="N",
        help="a Conformer trained with dynamic chunks (model.encoder.dynamic_chunks): run "
             "with chunks of N encoder frames (0: full context) instead of "
             "model.encoder.chunk_frames",
    )  # fmt: skip
    chunks.add_argument(
        "--lookahead-frames", type=int, metavar="R", action=_Lookahead, dest="lookahead",
        help="a model trained with several look-aheads (model.encoder.lookaheads: NeMo's "
             "cache-aware streaming models, att_context_size [[left, R], ...]): run with "
             "the look-ahead of R encoder frames (chunks of R + 1) instead of the first",
    )  # fmt: skip
