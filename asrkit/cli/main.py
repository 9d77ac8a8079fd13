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
import shutil
import subprocess
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
    import_model,
    lm,
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
    export, transcribe, plot, import_model, lm,
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


def use_bfc_allocator() -> None:
    """TensorFlow's BFC allocator for CPU tensors (what it uses on GPUs) unless the user set
    TF_CPU_ALLOCATOR_USE_BFC: it keeps freed blocks for the next step instead of handing
    large tensors back to the kernel and faulting them in again (one epoch of the mini
    recipe: 1-10 % less training time, a third less kernel time, the same dev WER;
    RESULTS.md). Read when TensorFlow starts, so set before any command imports it."""
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    use_bfc_allocator()
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
    from asrkit.outputs import taking_back_on_failure

    try:
        with taking_back_on_failure():
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
        return getattr(err, "exit_code", 2)
    finally:
        warnings.formatwarning = formatwarning


def _audio_notice(command: str) -> None:
    from asrkit.audio import conversion_notice

    notice = conversion_notice()
    if notice:
        print(f"asrkit {command}: notice: {notice}", file=sys.stderr)


# TensorFlow's native start-up chatter on descriptor 2: absl's info/warning/error lines
# ("I0000 00:00:17... port.cc:153] oneDNN custom operations are on", "E0000 ...
# cuda_platform.cc:52] failed call to cuInit") and absl's notice about early messages.
# A fatal line ("F0000 ... Check failed") and anything else (an abort's message) pass.
# With several workers, the later lines of TensorFlow's report of a lost peer go too (the
# error `asrkit train` then raises names the worker in one line).
NATIVE_NOISE = (
    r"^[IWE][0-9]{4} [0-9:. ]+[0-9]+ [A-Za-z0-9_./-]+:[0-9]+\] "
    r"|^WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|^/job:[a-z]+/replica:[0-9]+/task:[0-9]+$|^The tasks have crashed\. "
    r"|^The error could be from a previous operation\. Restart your program to reset\."
    r"|^Additional GRPC error information from remote target /job:"
    r"|^:UNKNOWN:Error received from peer "
)


def quiet_tensorflow(verbose: bool) -> None:
    """Keeps TensorFlow's native start-up logging off the terminal (unless `verbose`),
    without hiding a native crash.

    TF 2.21's native libraries log through absl whatever the log level, straight to file
    descriptor 2. So descriptor 2 is pointed into a pipe read by a `grep` child process that
    drops those lines (`NATIVE_NOISE`) and passes everything else to the real stderr: the
    child outlives a crashing process, so a CHECK failure or an abort still prints. Python's
    `sys.stderr` (our errors, warnings, tracebacks) writes to the original stderr directly.
    Without `grep` on the machine, descriptor 2 stays as it is.
    """
    if verbose or "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # TensorFlow itself is imported only by the commands that need it, after they checked
    # their arguments; its Python logger (deprecation notices) keeps errors only.
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    grep = shutil.which("grep")
    if grep is None:
        return
    sys.stderr.flush()
    original = os.dup(2)
    read_end, write_end = os.pipe()
    subprocess.Popen(
        [grep, "--line-buffered", "-v", "-E", NATIVE_NOISE],
        stdin=read_end, stdout=original, stderr=subprocess.DEVNULL, close_fds=True,
        start_new_session=True,  # a Ctrl-C for the command does not end the filter first
    )  # fmt: skip
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    sys.stderr = os.fdopen(original, "w", buffering=1, encoding=sys.stderr.encoding,
                           errors=sys.stderr.errors)  # fmt: skip


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
