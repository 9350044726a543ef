"""The one way attnmt writes a file: atomically, so a crash or a kill never leaves a
half-written file over a good one.

Every writer goes through `atomic_file`: the content is written to a hidden temporary
file beside the target (`.<name>.<random>.tmp`), flushed to disk and renamed over the
target. A kill between the write and the rename leaves only such a temporary file,
which `remove_stale_temp_files` deletes when a run starts again.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

TEMP_SUFFIX = ".tmp"


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file object whose content replaces `path` when the block ends without error.

    The parent folder is created. On an exception the temporary file is removed and
    `path` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Writes text (UTF-8, "\\n" line ends kept as given) or bytes to `path` atomically."""
    with atomic_file(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def remove_stale_temp_files(directory: str | os.PathLike) -> list[Path]:
    """Deletes the temporary files a killed `atomic_file` left in `directory` (not below).

    Returns the removed paths.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    # ".*.tmp*" also matches the ".<name>.tmp<pid>" files of attnmt before cef8104.
    stale = [p for p in directory.glob(f".*{TEMP_SUFFIX}*") if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale
