"""Where commands write: checked before any work, written so that no result is lost.

`writable_directory` is called by a command before it loads a model or reads data: it
creates the directory if needed (and takes it back if the check fails) and writes (and
removes) a probe file there, so a read-only mount, a path under a file or a full disk fails
in the first second, naming the option and the path. A command run inside
`taking_back_on_failure` (every `asrkit` command is) removes on failure each directory it
created that is still empty, so a failed command leaves no empty directory behind.
`write_files` writes a command's results each whole (`.tmp`, then renamed); if the target
fails after all (the disk filled up meanwhile), the results are written to a fresh
directory under the system's temporary directory and the error says where they are.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

from asrkit.errors import UserError
from asrkit.sizes import format_bytes

# What an OSError means, in the words a user acts on.
_PLAIN = {
    errno.EACCES: "permission denied",
    errno.EPERM: "not permitted (a read-only or immutable directory?)",
    errno.EROFS: "the file system is read-only",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EEXIST: "it exists and is not a directory",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.ENOENT: "no such file or directory",
    errno.EISDIR: "it is a directory",
}


# The directories `writable_directory` created during the current command (outermost last).
_created: list[Path] | None = None


@contextlib.contextmanager
def taking_back_on_failure():
    """Runs a command; if it raises, the directories it created that are still empty are
    removed (innermost first), then the exception goes on."""
    global _created
    outer, _created = _created, []
    try:
        yield
    except BaseException:
        _remove_empty(_created)
        raise
    finally:
        _created = outer


class OutputError(UserError, OSError):
    """An output that cannot be written; the message names the path and what to do."""


def plain_reason(err: OSError) -> str:
    """What the operating system said, in plain words."""
    return _PLAIN.get(err.errno, err.strerror or str(err))


def writable_directory(
    path: str | os.PathLike, option: str, needed_bytes: int = 0, shown: Path | None = None
) -> Path:
    """`path` created if missing and proven writable (and with `needed_bytes` free, when a
    size can be estimated); `OutputError` naming `option` (and `shown`, the path the user
    gave, if that is not `path` itself) otherwise."""
    path = Path(path)
    shown = shown or path
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise OutputError(
            f"{option} {shown}: cannot write there (a part of the path is a file, not a "
            f"directory: {existing}); choose a directory you can write to"
        )
    created = [p for p in (path, *path.parents) if not p.exists()]
    if _created is not None:
        _created.extend(created)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".asrkit-probe-"):
            pass
    except OSError as err:
        _remove_empty(created)
        raise OutputError(
            f"{option} {shown}: cannot write there ({plain_reason(err)}); choose a directory "
            "you can write to"
        ) from None
    if needed_bytes:
        free = shutil.disk_usage(path).free
        if free < needed_bytes:
            _remove_empty(created)
            raise OutputError(
                f"{option} {shown}: {format_bytes(free)} free, about {format_bytes(needed_bytes)} "
                "needed; free space or choose another directory"
            )
    return path


def _remove_empty(created: list[Path]) -> None:
    """Takes back the directories a failed check made (innermost first)."""
    for directory in created:
        with contextlib.suppress(OSError):
            directory.rmdir()


def writable_parent(path: str | os.PathLike, option: str) -> Path:
    """For an output that is created whole (a SavedModel, a file): its parent directory is
    proven writable; the path itself is returned."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{option} {path}: exists and is not a directory")
    writable_directory(path.parent, option, shown=path)
    return path


def writable_file(path: str | os.PathLike, option: str) -> Path:
    """For an output file written whole (replacing one that is there): it is not a
    directory and its directory is proven writable; the path is returned."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{option} {path}: is a directory; give a file name")
    writable_directory(path.parent, option, shown=path)
    return path


@contextlib.contextmanager
def replacing_directory(path: str | os.PathLike, option: str, force: bool):
    """Yields a new directory beside `path` to write a whole result (an export) into; on
    success it takes `path`'s place (what `path` held is removed only then), on failure it
    is removed. A `path` that exists and is not empty needs `force`."""
    path = Path(path)
    if path.exists() and any(path.iterdir()) and not force:
        raise OutputError(
            f"{option} {path}: exists and is not empty (an earlier export?); add --force to "
            "replace it, or choose another directory"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{path.name}.writing-", dir=path.parent))
    try:
        yield fresh
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.replaced-{os.getpid()}")
        os.replace(path, old)
    os.replace(fresh, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_files(directory: str | os.PathLike, files: dict[str, str]) -> Path:
    """Writes `{name: text}` into `directory`, each file whole. If that fails, every file
    is written to a new directory under the system's temporary directory instead and
    `OutputError` says where: results are never lost to a late write error."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            _write_whole(directory / name, text)
        return directory
    except OSError as err:
        reason = plain_reason(err)
    rescue = Path(tempfile.mkdtemp(prefix="asrkit-results-"))
    for name, text in files.items():
        _write_whole(rescue / name, text)
    raise OutputError(
        f"{directory}: could not write the results ({reason}); they are kept in {rescue}"
    )


def _write_whole(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
