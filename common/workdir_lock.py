"""One writer per run: the lock a command holds on a workdir while it writes there.

    with WorkdirLock(workdir, purpose="training", hint="wait for it to end, or give "
                     "another --workdir"):
        ...  # write into workdir

The lock is an advisory `flock` on `<workdir>/.lock`. The kernel drops it when the
holder's file is closed, so a killed holder (SIGKILL, a lost node) never leaves the
workdir locked: the next command finds the file unlocked and takes it. On NFS Linux
emulates `flock` with byte-range locks that the server arbitrates, so the lock also
holds between hosts (only process 0 of a multi-process run takes it: it alone writes).

Two kinds of holder:
  * exclusive (train.py, and train.py --seeds on the parent folder): nobody else;
  * shared (evaluate.py writing `<workdir>/eval/`): any number of shared holders side by
    side, never beside an exclusive one, so evaluations do not block each other but a
    run that is training is not evaluated into, nor trained while one writes results.

A holder writes who it is (pid, host, start time, command) into the file, so that a
refused command names it in its one line: `UserError("runs/x is in use by pid P on host
H since T (train.py, training); <hint>")`. Several shared holders share one record,
the latest one's. The file is deleted by the last holder to leave (while it still holds
the lock; a newcomer checks that the path still names the file it locked, and starts
over if not), so a finished command leaves no trace; a killed one leaves the file,
unlocked. Folders the lock created are removed with it if they are still empty: a
command refused after taking the lock (a tokenizer that cannot be trained on the
corpus, say) leaves no empty workdir behind.

A file system without working locks (ENOLCK, EOPNOTSUPP) cannot give the guarantee: a
one-line warning says so and the command goes on unlocked, as before locks existed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

from common.errors import UserError

try:
    import fcntl
except ImportError:  # not POSIX: no locks (module docstring, last paragraph)
    fcntl = None

LOCK_NAME = ".lock"
RECORD_BYTES = 1024  # the holder's record, padded: each write replaces the whole of it
# A holder found locked is asked again over this long: one that is just leaving (it
# holds the lock for the moment it deletes the file) is not mistaken for a writer.
RETRY_SECONDS = 0.3


def lock_path(folder: str | os.PathLike) -> Path:
    """The lock file of `folder`."""
    return Path(folder) / LOCK_NAME


def _still_named(fd: int, path: Path) -> bool:
    """True when `path` still names the open file `fd` (its holder did not delete it)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def read_holder(folder: str | os.PathLike) -> dict | None:
    """The record of the process holding (or that last held) `folder`'s lock; None when
    there is none or it cannot be read."""
    try:
        text = lock_path(folder).read_bytes()[:RECORD_BYTES]
        record = json.loads(text.decode("utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def describe_holder(record: dict | None) -> str:
    """`pid P on host H since T (command, purpose)`, or words for an unknown holder."""
    if not record:
        return "another process (it left no record)"
    what = ", ".join(str(record[k]) for k in ("command", "purpose") if record.get(k))
    return (f"pid {record.get('pid', '?')} on host {record.get('host', '?')} since "
            f"{record.get('since', '?')}" + (f" ({what})" if what else ""))


class WorkdirLock:
    """The lock of one folder, as a context manager (module docstring).

    folder: the workdir (created if missing, when the lock is taken).
    shared: a shared holder (evaluate.py), else exclusive.
    purpose: what the holder does there, for the message of the one it refuses.
    hint: what the refused command's user can do, the end of its error line.
    """

    def __init__(self, folder: str | os.PathLike, *, shared: bool = False,
                 purpose: str = "", hint: str = ""):
        self.folder, self.path = Path(folder), lock_path(folder)
        self.shared, self.purpose, self.hint = shared, purpose, hint
        self._fd: int | None = None
        self._created: list[Path] = []  # folders made for the lock, deepest first

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> WorkdirLock:
        """Takes the lock; UserError naming the holder when another process has it (an
        exclusive one, or any one for an exclusive request); OSError (naming the lock
        file) when it cannot be created: a read-only or missing folder."""
        if self.held:
            return self
        deadline = time.monotonic() + RETRY_SECONDS
        while True:
            self._make_folder()
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                             0o666)
            except FileNotFoundError:  # a refused command removed its empty folder meanwhile
                continue
            taken = self._flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX)
                                if fcntl else 0)
            if taken and _still_named(fd, self.path):
                self._fd = fd
                self._write_record()
                return self
            holder = read_holder(self.folder) if not taken else None
            os.close(fd)
            if taken:  # locked a file its last holder deleted: start over on a new one
                continue
            if time.monotonic() > deadline:
                raise UserError(f"{self.folder} is in use by {describe_holder(holder)}"
                                + (f"; {self.hint}" if self.hint else ""))
            time.sleep(0.05)

    def release(self) -> None:
        """Lets the lock go; the last holder deletes the file first (module docstring)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            # A shared holder is the last one if it can have the lock to itself.
            last = not self.shared or self._flock(fd, fcntl.LOCK_EX if fcntl else 0,
                                                  quiet=True)
            if last and _still_named(fd, self.path):
                self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)
        for folder in self._created:  # deepest first; a folder with anything in it stays
            try:
                folder.rmdir()
            except OSError:
                break
        self._created = []

    def _make_folder(self) -> None:
        """Creates the folder and its missing parents, noting which were missing."""
        missing = []
        folder = self.folder.absolute()
        while not folder.exists() and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        self.folder.mkdir(parents=True, exist_ok=True)
        self._created = missing + [f for f in self._created if f not in missing]

    def _flock(self, fd: int, operation: int, quiet: bool = False) -> bool:
        """flock without waiting: False if another process holds a conflicting lock;
        True on a file system without locks (warned once, unless `quiet`)."""
        if fcntl is None:
            return True
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as e:  # ENOLCK, EOPNOTSUPP: a file system without (working) locks
            if not quiet:
                print(f"warning: cannot lock {self.path} ({e.strerror}): nothing stops a "
                      "second writer of this folder", file=sys.stderr, flush=True)
            return True
        return True

    def _write_record(self) -> None:
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                  "command": Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python",
                  "purpose": self.purpose}
        data = json.dumps(record).encode("utf-8")[:RECORD_BYTES - 1]
        # One write of the whole padded record: a reader (or another shared holder's
        # write) never sees half of one.
        os.pwrite(self._fd, data.ljust(RECORD_BYTES - 1) + b"\n", 0)
        os.ftruncate(self._fd, RECORD_BYTES)


EVALUATION_HINT = ("run it once training has ended (its checkpoints may be deleted or its "
                   "best step change meanwhile)")


def evaluation_locks(workdirs: list[Path], purpose: str = "evaluation") -> contextlib.ExitStack:
    """The shared locks of `workdirs`, all held or none, for a command that writes their
    eval/ (evaluate.py, attention.align --select, attention.heads): side by side with each
    other, never into a run being trained (UserError naming the training that holds one).
    Use as `with evaluation_locks([workdir]): ...`, once every check of the command has
    passed: taking a lock creates (then deletes) the lock file, which touches the folder."""
    stack = contextlib.ExitStack()
    with stack:
        for workdir in workdirs:
            stack.enter_context(WorkdirLock(workdir, shared=True, purpose=purpose,
                                            hint=EVALUATION_HINT))
        return stack.pop_all()


def check_not_training(folder: str | os.PathLike, hint: str = EVALUATION_HINT) -> None:
    """UserError naming the holder (and giving `hint`) when a process holds `folder`
    exclusively (a training), creating and changing nothing: for a command to refuse
    before it reads what that training may be rewriting, or before long work that it
    would write into the folder afterwards (under a lock of its own, which checks again)."""
    if fcntl is None:
        return
    deadline = time.monotonic() + RETRY_SECONDS  # as WorkdirLock.acquire: a holder just
    while True:  # leaving is not a writer, and one just arriving has its record written
        try:
            fd = os.open(lock_path(folder), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:  # no lock file: nobody holds the folder
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = read_holder(folder)
        except OSError:  # a file system without locks: evaluation_locks warns
            return
        finally:
            os.close(fd)
        if time.monotonic() > deadline:
            raise UserError(f"{folder} is in use by {describe_holder(holder)}; {hint}")
        time.sleep(0.05)
