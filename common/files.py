"""The one way attnmt writes a file: atomically, so a crash or a kill never leaves a
half-written file over a good one.

Every writer goes through `atomic_file`: the content is written to a hidden temporary
file beside the target (`.<name>.<random>.tmp`), flushed to disk and renamed over the
target. A folder built in several steps (the tokenizer) is built in a `temp_folder` of
the same naming, `.<name>.<random>.tmp/`, and renamed into place by its caller.

A kill between the start and the rename leaves only such a temporary file or folder,
and `remove_stale_temp_files` deletes them when a run starts again. A writer holds an
exclusive `flock` on its temporary file or folder until the rename, so the clean-up
recognises a leftover by the lock nobody holds (the kernel drops a killed process's
locks) and never deletes the temporary file of a writer that is still running, e.g. an
evaluate.py writing into `<workdir>/eval/` while a training run starts.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from common.errors import UserError

try:
    import fcntl
except ImportError:  # not POSIX: no locks, the clean-up then takes every leftover
    fcntl = None

# The process umask, read once at import (os.umask can only be read by setting it):
# mkstemp makes 0600 files, while a file written by plain open() is 0666 & ~umask.
_UMASK = os.umask(0o022)
os.umask(_UMASK)
TEMP_SUFFIX = ".tmp"
# `.<name>.<random>.tmp`, files and folders: tempfile's random part is 8 characters
# of [a-z0-9_]; any length is accepted.
TEMP_NAME = re.compile(r"\..+\.[A-Za-z0-9_]+\.tmp")
# Names written by attnmt before this scheme: `.<name>.tmp<pid>` files (before cef8104)
# and the tokenizer's `.tokenizer-tmp-<random>` folders.
LEGACY_TEMP_NAMES = (re.compile(r"\..+\.tmp\d+"), re.compile(r"\.tokenizer-tmp-.+"))


def is_temp_name(name: str) -> bool:
    """True for the name of a temporary file or folder of `atomic_file` / `temp_folder`."""
    return any(p.fullmatch(name) for p in (TEMP_NAME, *LEGACY_TEMP_NAMES))


def _lock(fd: int, wait: bool = True) -> bool:
    """Takes the exclusive flock of `fd`; False if another process holds it (wait=False).

    A file system without locks counts as locked: writing works as before locks existed.
    """
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError:  # ENOLCK, EOPNOTSUPP, ...: a file system without (working) locks
        return True
    return True


def _still_named(fd: int, path: str) -> bool:
    """True when `path` still names the open file `fd`; False when a clean-up took it
    between its creation and our lock (then the writer starts over with a new name)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _with_target(e: OSError, target: Path) -> OSError:
    """`e` naming `target` instead of a temporary name (the user knows the target),
    or naming `target` at all when the error came without a path (a full disk on write)."""
    if e.errno is None:  # raised by hand with a message only: nothing to rename
        return e
    return OSError(e.errno, e.strerror or os.strerror(e.errno), str(target))  # same subclass


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file object whose content replaces `path` when the block ends without error.

    The parent folder is created. On an exception the temporary file is removed and
    `path` is untouched. A failure to create, write or rename raises an OSError that
    names `path` (not the temporary name).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        while True:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX,
                                       dir=path.parent)
            if _lock(fd) and _still_named(fd, tmp):
                os.fchmod(fd, 0o666 & ~_UMASK)  # readable as open() would make it
                break
            os.close(fd)
    except OSError as e:
        raise _with_target(e, path) from e
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                yield f
                f.flush()
                os.fsync(f.fileno())
                # Renamed while the lock is still held: closing first would let a
                # clean-up take the finished file.
                os.replace(tmp, path)
            except OSError as e:
                if e.errno is not None and e.filename in (None, tmp):
                    raise _with_target(e, path) from e
                raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Writes text (UTF-8, "\\n" line ends kept as given) or bytes to `path` atomically."""
    with atomic_file(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


@contextlib.contextmanager
def temp_folder(target: str | os.PathLike) -> Iterator[Path]:
    """A new empty folder `.<target name>.<random>.tmp` beside `target`, locked (see the
    module docstring) while the block runs and deleted after it, unless the block renamed
    it (onto `target`: `os.replace(folder, target)`). The parent folder is created."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        while True:
            folder = tempfile.mkdtemp(prefix=f".{target.name}.", suffix=TEMP_SUFFIX,
                                      dir=target.parent)
            fd = os.open(folder, os.O_RDONLY)
            if _lock(fd) and _still_named(fd, folder):
                break
            os.close(fd)
    except OSError as e:
        raise _with_target(e, target) from e
    try:
        yield Path(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # nothing left if it was renamed
        os.close(fd)


def _remove_if_unlocked(path: Path) -> bool:
    """Removes a temporary file or folder unless a running writer holds its lock."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # never wait on a FIFO
    except FileNotFoundError:  # its writer renamed it meanwhile
        return False
    except OSError:  # unreadable: no lock to ask, so it is taken as a leftover
        fd = None
    try:
        if fd is not None and not _lock(fd, wait=False):
            return False
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        return True
    finally:
        if fd is not None:
            os.close(fd)


def remove_stale_temp_files(directory: str | os.PathLike) -> list[Path]:
    """Deletes the temporary files and folders that killed writers left in `directory`
    (not below): `.<name>.<random>.tmp` and the legacy names (`LEGACY_TEMP_NAMES`).
    Those of a writer that is still running (it holds their lock) are kept.

    Call it where attnmt writes: a workdir, `<workdir>/attention`, `<workdir>/eval`.
    Returns the removed paths.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = [p for p in sorted(directory.iterdir()) if is_temp_name(p.name)]
    return [p for p in stale if _remove_if_unlocked(p)]


def require_file(path: str | os.PathLike, error: type[Exception] = UserError) -> Path:
    """`path` if it is an existing file; else `error` saying what is there instead (nothing,
    or a folder), the one wording every reader of user files uses."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{path} is a folder, not a file")
    if not path.is_file():
        raise error(f"file not found: {path}")
    return path


def prepare_output_folder(folder: str | os.PathLike) -> Path:
    """Creates `folder` if needed, checks that a file can be written in it and removes
    the temp files a killed writer left there. Called before hours of work that end in
    a write, so a read-only or full location fails at once (the OSError names the path).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
        pass
    remove_stale_temp_files(folder)
    return folder
