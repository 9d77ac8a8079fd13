"""`asrkit` command: a registry of subcommands, each a thin wrapper around a library call.

User errors (`asrkit.errors.UserError`, and a file or directory that is missing or cannot
be read) become one line `asrkit <command>: error: ...` on stderr and exit code 2; anything
else is a bug and keeps its traceback. TensorFlow's native logging (oneDNN notices, CUDA
probing, CPU-feature lines) is kept off the terminal unless `--verbose` or ASRKIT_VERBOSE=1.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import warnings

from asrkit import __version__
from asrkit.cli import (
    average,
    calibrate,
    corpus,
    decode,
    export,
    features,
    plan,
    plot,
    prepare,
    tokenizer,
    train,
    transcribe,
    verify,
)
from asrkit.errors import UserError

# Each subcommand module exposes `register(subparsers)`; its parser sets `func`.
SUBCOMMANDS = (
    corpus, prepare, tokenizer, features, plan, train, verify, average, decode, calibrate,
    export, transcribe, plot,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asrkit", description="RNN-Transducer speech recognition on TensorFlow / Keras 3"
    )
    parser.add_argument("--version", action="version", version=f"asrkit {__version__}")
    parser.add_argument("--verbose", action="store_true", help="show TensorFlow's own logging")
    parser.add_argument("--debug", action="store_true", help="tracebacks for every error")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_tensorflow(verbose=args.verbose or os.environ.get("ASRKIT_VERBOSE") == "1")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    command = " ".join(p for p in (args.command, getattr(args, "action", None)) if p)
    formatwarning = warnings.formatwarning
    if not args.debug:  # our warnings speak like our errors: one line, no source excerpt
        warnings.formatwarning = lambda message, *_a, **_k: (
            f"asrkit {command}: warning: {message}\n"
        )
    try:
        code = int(args.func(args) or 0)
        _audio_notice(command)
        return code
    except KeyboardInterrupt:
        print(f"asrkit {command}: interrupted", file=sys.stderr)
        return 130
    except (UserError, OSError) as err:
        if args.debug or not _is_user_error(err):
            raise
        print(f"asrkit {command}: error: {_describe(err)}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = formatwarning


def _audio_notice(command: str) -> None:
    from asrkit.audio import conversion_notice

    notice = conversion_notice()
    if notice:
        print(f"asrkit {command}: notice: {notice}", file=sys.stderr)


def quiet_tensorflow(verbose: bool) -> None:
    """Keeps TensorFlow's native logging off the terminal (unless `verbose`).

    TF 2.21's native libraries log through absl whatever the log level (the "All log
    messages before absl::InitializeLog()" notice at import, "failed call to cuInit" when the
    devices are first listed, oneDNN notices at the first boolean op), straight to file
    descriptor 2. So descriptor 2 is pointed at /dev/null for the whole process and Python's
    `sys.stderr` (our errors, warnings, tracebacks) writes to a duplicate of the original.
    TensorFlow's Python logger keeps errors only (e.g. no deprecation notices from the
    TensorBoard event reader `asrkit plot` uses).
    """
    if verbose or "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    original = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stderr = os.fdopen(original, "w", buffering=1, encoding=sys.stderr.encoding,
                           errors=sys.stderr.errors)  # fmt: skip
    # TensorFlow itself is imported only by the commands that need it, after they checked
    # their arguments; its Python logger (deprecation notices) keeps errors only.
    logging.getLogger("tensorflow").setLevel(logging.ERROR)


_USER_OS_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError,
                   FileExistsError)  # fmt: skip


def _is_user_error(err: BaseException) -> bool:
    user_errno = getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
    return isinstance(err, (UserError, *_USER_OS_ERRORS)) or user_errno


def _describe(err: BaseException) -> str:
    if isinstance(err, OSError) and not isinstance(err, UserError) and err.filename:
        from asrkit.outputs import plain_reason

        return f"{err.filename}: {plain_reason(err)}"
    return str(err).strip() or type(err).__name__


def train_alias(argv: list[str] | None = None) -> int:
    """`asrkit-train ...` is `asrkit train ...`."""
    argv = sys.argv[1:] if argv is None else argv
    return main(["train", *argv])


if __name__ == "__main__":
    sys.exit(main())
