"""The whole error surface of the command-line tools, in one place.

Every CLI (train.py, evaluate.py, attention.inspect, attention.align, attention.heads) runs as a
subprocess on a table of bad inputs: user errors, OSErrors on user paths (missing, a
folder given as a file, a path under a file, a read-only workdir) and library errors
on user input (non-UTF-8 text, a truncated .npz, a corrupt config.json). Each must end
with exit code 2 and exactly one `error: ` line, the last on stderr, with no traceback,
and leave the files it was given unchanged: byte for byte, and with no file or folder
created, deleted or touched (a full listing with sizes, modification times and hashes).

A read-only mount is a `sitecustomize.py` first on PYTHONPATH (writes below a folder
raise OSError(EROFS)). The subprocesses run side by side (most of each is start-up).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_module, run_script
from test_mapfile import make_maps

from attention.mapfile import ARRAY_NAMES
from common.workdir_lock import WorkdirLock
from data.corpora import DataError

SMOKE = ("--config", "configs/smoke.py")
FIXTURES = Path(__file__).parent / "fixtures"
PAIRS, GOLD = FIXTURES / "rwth_de_en.head10.de-en", FIXTURES / "rwth_de_en.head10.talp"
NOT_UTF8 = b"ein Hund\nein \xff\xfe Hund\n"

SITECUSTOMIZE = '''
"""Writes below $ATTNMT_TEST_READ_ONLY fail with EROFS, as on a read-only mount: wraps
os.open (so tempfile.mkstemp), io.open / open, os.mkdir (so os.makedirs, Path.mkdir,
tempfile.mkdtemp) and the rename / remove calls."""
import builtins, errno, io, os

_ROOT = os.path.realpath(os.environ["ATTNMT_TEST_READ_ONLY"])
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _full(path, dir_fd=None):
    if dir_fd is not None:
        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), os.fsdecode(path))
    return os.path.realpath(os.fsdecode(path))


def _check(path, dir_fd=None):
    full = None if isinstance(path, int) else _full(path, dir_fd)  # an fd: checked at open
    if full is not None and (full == _ROOT or full.startswith(_ROOT + os.sep)):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))


def _guard(name, written):  # written(*args, **kwargs): the [(path, dir_fd)] os.<name> writes
    real = getattr(os, name)

    def wrapper(*args, **kwargs):
        for path, dir_fd in written(*args, **kwargs):
            _check(path, dir_fd)
        return real(*args, **kwargs)

    setattr(os, name, wrapper)


_guard("open", lambda path, flags, *a, dir_fd=None, **k:
       [(path, dir_fd)] if flags & _WRITE else [])
# An existing folder: the kernel answers EEXIST first, which Path.mkdir(exist_ok) accepts.
_guard("mkdir", lambda path, *a, dir_fd=None, **k:
       [] if os.path.lexists(_full(path, dir_fd)) else [(path, dir_fd)])
for _name in ("unlink", "remove", "rmdir", "chmod", "utime"):
    _guard(_name, lambda path, *a, dir_fd=None, **k: [(path, dir_fd)])
_guard("truncate", lambda path, *a, **k: [(path, None)])
for _name in ("replace", "rename"):
    _guard(_name, lambda src, dst, *a, src_dir_fd=None, dst_dir_fd=None, **k:
           [(src, src_dir_fd), (dst, dst_dir_fd)])
_guard("link", lambda src, dst, *a, dst_dir_fd=None, **k: [(dst, dst_dir_fd)])
_guard("symlink", lambda src, dst, *a, dir_fd=None, **k: [(dst, dir_fd)])
_real_open = io.open


def _open(file, mode="r", *args, **kwargs):
    if any(c in mode for c in "wax+"):
        _check(file)
    return _real_open(file, mode, *args, **kwargs)


io.open = builtins.open = _open
'''


def contents(root: Path) -> dict[str, bytes] | None:
    """Every file under `root` (relative path -> content); None if `root` does not exist."""
    if not root.exists():
        return None
    if root.is_file():
        return {"": root.read_bytes()}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def snapshot(root: Path) -> dict[str, tuple] | None:
    """Every file and folder under `root`, `root` included: relative path -> (kind, size,
    modification time in ns, SHA-256 of a file's content); None if `root` does not exist.
    A folder's time changes when an entry is created or deleted in it, so a file written
    and removed again (a probe, a lock) shows too."""
    if not root.exists():
        return None

    def entry(p: Path) -> tuple:
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
        return ("dir" if p.is_dir() else "file", st.st_size if p.is_file() else None,
                st.st_mtime_ns, digest)

    return {str(p.relative_to(root)): entry(p) for p in [root, *sorted(root.rglob("*"))]}


@dataclass
class Case:
    """One command line and what its error line must say."""

    cli: str  # a script (train.py, evaluate.py) or a module (attention.inspect)
    argv: list[str]
    expect: tuple[str, ...] = ()  # fragments of the error line (case-insensitive)
    watch: tuple[Path, ...] = ()  # files and folders the failed command must leave as they were
    env: dict = field(default_factory=dict)  # extra environment (`Setup.read_only`)


class Setup:
    """Builds the inputs of the cases in one temporary folder."""

    def __init__(self, root: Path, smoke: Path):
        self.root, self.smoke = root, smoke
        self.site = root / "site"
        self.site.mkdir()
        (self.site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.a_file = self.file("a_file", b"not a folder\n")
        self.folder = root / "a_folder"
        self.folder.mkdir()
        self.maps = next(iter(sorted((smoke / "attention").glob("*.npz"))))
        self.locks: list[WorkdirLock] = []

    def file(self, name: str, content: bytes) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        return path

    def copy(self, name: str) -> Path:
        """A private copy of the smoke workdir, for a case that may write."""
        return Path(shutil.copytree(self.smoke, self.root / name, symlinks=True))

    def held(self, name: str, copy: bool = True) -> Path:
        """A copy of the smoke workdir (or an empty folder) whose lock this test process
        holds as a training would (released when the fixture ends)."""
        folder = self.copy(name) if copy else self.root / name
        self.locks.append(WorkdirLock(folder, purpose="training").acquire())
        return folder

    def read_only(self, path: Path) -> dict[str, str]:
        """The environment in which every write below `path` fails with EROFS."""
        return {"ATTNMT_TEST_READ_ONLY": str(path),
                "PYTHONPATH": os.pathsep.join([str(self.site), str(REPO)])}

    def train_fresh(self, name: str, *flags: str, expect: tuple[str, ...],
                    watch: tuple[Path, ...] = ()) -> Case:
        """train.py into a new workdir of its own (a case that wrongly creates it must not
        fail another), which must still not exist after the error."""
        workdir = self.root / "never_written" / name
        return Case("train.py", [*SMOKE, "--workdir", str(workdir), *flags], expect,
                    (workdir, *watch))

    def train_text(self, name: str, train_src: bytes, train_tgt: bytes,
                   expect: tuple[str, ...]) -> Case:
        """train.py on a `text` corpus in a folder of its own (watched too)."""
        corpus = self.root / f"corpus_{name}"
        for file, content in {"train.de": train_src, "train.en": train_tgt,
                              "valid.de": b"ein Hund\n", "valid.en": b"a dog\n"}.items():
            self.file(f"corpus_{name}/{file}", content)
        flags = [f"--config.data.{split}_{side}={corpus / f'{split}.{lang}'}" for split in
                 ("train", "valid") for side, lang in (("source", "de"), ("target", "en"))]
        return self.train_fresh(name, "--config.data.dataset=text", *flags,
                                expect=tuple(e.format(corpus=corpus) for e in expect),
                                watch=(corpus,))


def _on_copy(s: Setup, name: str, cli: str, flags: list[str], expect: tuple[str, ...],
             plant: dict[str, bytes] | None = None, read_only: bool = False) -> Case:
    """`cli --workdir COPY flags...` on a private, watched copy of the smoke workdir with
    the files `plant` (relative path -> content) written into it; "{workdir}" in `expect`
    is the copy."""
    workdir = s.copy(name)
    for relative, content in (plant or {}).items():
        (workdir / relative).write_bytes(content)
    return Case(cli, ["--workdir", str(workdir), *flags],
                tuple(e.format(workdir=workdir) for e in expect), (workdir,),
                s.read_only(workdir) if read_only else {})


def _truncated_checkpoint(s: Setup) -> dict[str, bytes]:
    """The largest array file of the smoke run's step-40 checkpoint, cut in half."""
    state = s.smoke / "checkpoints" / "40" / "state"
    target = max((p for p in state.rglob("*") if p.is_file() and p.parent.name == "d"),
                 key=lambda p: p.stat().st_size)
    return {str(target.relative_to(s.smoke)): target.read_bytes()[: target.stat().st_size // 2]}


def _ensemble(s: Setup, name: str, twice: bool) -> Case:
    """evaluate.py with an --ensemble member that is --workdir itself (another spelling
    of the path) or another run given twice."""
    workdir = s.copy(name)
    other = s.copy(f"{name}_other")
    members = [str(other), str(other)] if twice else [f"{workdir}/../{name}"]
    expect = f"given twice ({other})" if twice else "is --workdir itself"
    return Case("evaluate.py", ["--workdir", str(workdir), *QUICK, "--ensemble",
                                ",".join(members)], (expect, "twice the cost"), (workdir, other))


def _held(s: Setup, name: str, cli: str, flags: list[str], copy: bool = True) -> Case:
    """`cli --workdir W flags...` on a workdir whose lock this process holds as a
    training: refused, naming this process."""
    workdir = s.held(name, copy)
    return Case(cli, ["--workdir", str(workdir), *flags],
                (f"{workdir} is in use by pid {os.getpid()} on host", "training)"), (workdir,))


def _inspect_map(s: Setup, case: str, expect: str) -> Case:
    """inspect on a bad map file in a folder of its own (no PNG may appear beside it)."""
    path = s.root / case / "maps.npz"
    path.parent.mkdir()
    if case == "truncated":
        path.write_bytes(s.maps.read_bytes()[: s.maps.stat().st_size // 2])
    elif case == "not_npz":
        path.write_bytes(b"this is not a zip file\n")
    elif case == "missing_arrays":
        np.savez(path, weights=np.zeros((2, 2), np.float32))
    elif case == "pickled":  # every array there, but as objects: only unpickling reads them
        np.savez(path, **{a: np.array([{"a": 1}], dtype=object) for a in ARRAY_NAMES})
    else:  # a readable map file whose rows do not sum to 1
        maps = make_maps()
        np.savez(path, **{a: getattr(maps, a) for a in ARRAY_NAMES if a != "cross"},
                 cross=maps.cross * 2)
    return Case("attention.inspect", [str(path)], (str(path), expect), (path.parent,))


PAIRS_TEXT = b"".join(b"ein Hund Nummer %d\n" % i for i in range(20))
QUICK = ["--split", "test", "--max_sentences", "2"]  # evaluate.py: two sentences
# A `text` corpus but for data.train_source, which each case sets.
TEXT = ["--config.data.dataset=text", *(f"--config.data.{key}={PAIRS}" for key in (
    "train_target", "valid_source", "valid_target"))]
AER_FILES = ["--pairs", str(PAIRS), "--gold", str(GOLD)]
CASES: dict[str, Callable[[Setup], Case]] = {
    # train.py: flags and config, checked before anything is written (items 3 and 4).
    # (Flag parsing itself is tested in-process by tests/test_configs.py.)
    "train: unknown key": lambda s: s.train_fresh(
        "key", "--config.model.d_modle=64", expect=(
            "unknown config key config.model.d_modle", "did you mean config.model.d_model?")),
    "train: vocab_size=5": lambda s: s.train_fresh("vocab", "--config.data.vocab_size=5", expect=(
        "data.vocab_size=5", "too small", "required_chars")),
    "train: d_model=0": lambda s: s.train_fresh("d_model", "--config.model.d_model=0",
                                                expect=("model.d_model",)),
    "train: num_heads=3": lambda s: s.train_fresh("heads", "--config.model.num_heads=3", expect=(
        "model.d_model=32", "model.num_heads=3")),
    # train.py: values of the right type that mean nothing (configs/ranges.py).
    "train: max_minutes=-1": lambda s: s.train_fresh("budget", "--config.train.max_minutes=-1",
                                                     expect=("train.max_minutes must be at least 0",
                                                             "got -1.0")),
    "train: seed=2**32": lambda s: s.train_fresh("seed", f"--config.train.seed={2**32}", expect=(
        "train.seed must be in [0, 4294967295], got 4294967296",)),
    "train: learning_rate=0": lambda s: s.train_fresh(
        "lr", "--config.train.learning_rate=0", expect=("train.learning_rate must be above 0",)),
    # train.py: one writer per run (common/workdir_lock.py).
    "train: workdir in use": lambda s: _held(s, "train_held", "train.py", [*SMOKE]),
    "train: --seeds parent in use": lambda s: _held(
        s, "seeds_held", "train.py", [*SMOKE, "--seeds", "1"], copy=False),
    # train.py: the corpus.
    "train: corpus missing": lambda s: s.train_fresh(
        "missing", *TEXT, f"--config.data.train_source={s.root / 'no.de'}", expect=("no.de",)),
    "train: corpus is a folder": lambda s: s.train_fresh(
        "folder", *TEXT, f"--config.data.train_source={s.folder}", expect=(str(s.folder),)),
    "train: corpus not UTF-8": lambda s: s.train_text(
        "utf8", PAIRS_TEXT.replace(b"Nummer 2\n", b"Nummer \xff2\n"),
        PAIRS_TEXT.replace(b"ein Hund", b"a dog"),
        ("{corpus}/train.de: invalid UTF-8 on line 3",)),
    # train.py: the workdir (item 2: read-only).
    "train: workdir under a file": lambda s: Case(
        "train.py", [*SMOKE, "--workdir", str(s.a_file / "run")],
        (str(s.a_file), "is a file, not a folder"), (s.a_file,)),
    "train: corrupt config.json": lambda s: _on_copy(
        s, "train_corrupt", "train.py", [*SMOKE], ("{workdir}/config.json", "invalid JSON"),
        {"config.json": b'{"data": {"dataset": "multi30k", '}),
    "train: read-only resume": lambda s: _on_copy(
        s, "train_read_only", "train.py", [*SMOKE],
        ("{workdir}/.lock", "read-only file system"), read_only=True),
    # evaluate.py
    "evaluate: not a workdir": lambda s: Case("evaluate.py", ["--workdir", str(s.folder)],
                                              ("not a training workdir",), (s.folder,)),
    "evaluate: source missing": lambda s: Case(
        "evaluate.py", ["--workdir", str(s.smoke), "--source", str(s.root / "no.de")],
        ("no.de",)),
    "evaluate: source is a folder": lambda s: Case(
        "evaluate.py", ["--workdir", str(s.smoke), "--source", str(s.folder)], (str(s.folder),)),
    "evaluate: source not UTF-8": lambda s: Case(
        "evaluate.py", ["--workdir", str(s.smoke), "--source", str(s.file("bad.de", NOT_UTF8))],
        ("bad.de", "line 2")),
    "evaluate: config.json not UTF-8": lambda s: _on_copy(
        s, "eval_bad_json", "evaluate.py", QUICK, ("{workdir}/config.json", "not UTF-8"),
        {"config.json": b"\xff\xfe{"}),
    "evaluate: config.json not a config": lambda s: _on_copy(
        s, "eval_not_config", "evaluate.py", QUICK, ("config.json", "not a training config"),
        {"config.json": b"[1, 2]\n"}),
    "evaluate: eval is a file": lambda s: _on_copy(
        s, "eval_file", "evaluate.py", QUICK, ("{workdir}/eval", "is a file, not a folder"),
        {"eval": b"a file where the eval folder goes\n"}),
    "evaluate: read-only workdir": lambda s: _on_copy(
        s, "eval_read_only", "evaluate.py", QUICK, ("{workdir}/.lock", "read-only file system"),
        read_only=True),
    # evaluate.py: nothing (no eval/ folder) before every check has passed.
    "evaluate: missing checkpoint step": lambda s: _on_copy(
        s, "eval_step", "evaluate.py", [*QUICK, "--checkpoint", "7"],
        ("checkpoint '7' not found", "saved steps: [20, 40]")),
    "evaluate: truncated checkpoint": lambda s: _on_copy(
        s, "eval_truncated", "evaluate.py", QUICK, ("truncated or damaged",),
        _truncated_checkpoint(s)),
    "evaluate: ensemble of itself": lambda s: _ensemble(s, "ens_self", twice=False),
    "evaluate: ensemble member twice": lambda s: _ensemble(s, "ens_twice", twice=True),
    "evaluate: workdir being trained": lambda s: _held(s, "eval_held", "evaluate.py", QUICK),
    # python -m attention.inspect
    "inspect: map file missing": lambda s: Case("attention.inspect", [str(s.root / "no.npz")],
                                                ("no.npz",)),
    "inspect: map file is a folder": lambda s: Case("attention.inspect", [str(s.folder)],
                                                    (str(s.folder),), (s.folder,)),
    "inspect: truncated map file": lambda s: _inspect_map(s, "truncated", "not a readable .npz"),
    "inspect: not an npz": lambda s: _inspect_map(s, "not_npz", "not a readable .npz map file"),
    "inspect: missing arrays": lambda s: _inspect_map(s, "missing_arrays",
                                                      "missing arrays: encoder_self"),
    "inspect: pickled arrays": lambda s: _inspect_map(
        s, "pickled", "Object arrays cannot be loaded when allow_pickle=False"),
    "inspect: not normalised": lambda s: _inspect_map(s, "not_normalised",
                                                      "query row 0 sums to 2"),
    "inspect: --out under a file": lambda s: Case(
        "attention.inspect", [str(s.maps), "--out", str(s.a_file / "x.png")],
        (str(s.a_file), "is a file, not a folder"), (s.a_file,)),
    "inspect: --out read-only": lambda s: Case(
        "attention.inspect", [str(s.maps), "--out", str(s.folder / "x.png")],
        (str(s.folder / "x.png"), "read-only file system"), (s.folder,), s.read_only(s.folder)),
    "inspect: --gold not UTF-8": lambda s: Case(
        "attention.inspect", [str(s.maps), "--align", "--gold", str(s.file("b.talp", NOT_UTF8))],
        ("b.talp",)),
    # python -m attention.align
    "align: pairs missing": lambda s: Case(
        "attention.align", ["--workdir", str(s.smoke), "--pairs", str(s.root / "no"),
                               "--gold", str(GOLD)], ("no",)),
    "align: pairs is a folder": lambda s: Case(
        "attention.align", ["--workdir", str(s.smoke), "--pairs", str(s.folder),
                               "--gold", str(GOLD)], (str(s.folder),)),
    "align: pairs not UTF-8": lambda s: Case(
        "attention.align", ["--workdir", str(s.smoke), "--pairs",
                               str(s.file("bad.de-en", NOT_UTF8)), "--gold", str(GOLD)],
        ("bad.de-en", "UTF-8")),
    "align: --plot folder before the checks": lambda s: Case(
        "attention.align", ["--workdir", str(s.smoke), "--pairs", str(s.root / "no"),
                            "--gold", str(GOLD), "--plot", str(s.root / "align_plots" / "a.png")],
        ("no",), (s.root / "align_plots",)),
    "align: corrupt config.json": lambda s: _on_copy(
        s, "aer_corrupt", "attention.align", AER_FILES, ("{workdir}/config.json",
                                                            "invalid JSON"), {"config.json": b"{"}),
    # python -m attention.heads
    "heads: gold without pairs": lambda s: Case(
        "attention.heads", ["--workdir", str(s.smoke), "--gold", str(GOLD)], ("--gold_pairs",)),
    "heads: gold pairs is a folder": lambda s: Case(
        "attention.heads", ["--workdir", str(s.smoke), "--gold_pairs", str(s.folder),
                            "--gold", str(GOLD)], (str(s.folder), "folder")),
    "heads: corrupt config.json": lambda s: _on_copy(
        s, "heads_corrupt", "attention.heads", ["--max_sentences", "4"],
        ("{workdir}/config.json", "invalid JSON"), {"config.json": b"{"}),
    "heads: missing checkpoint step": lambda s: _on_copy(
        s, "heads_step", "attention.heads", ["--checkpoint", "7", "--max_sentences", "4"],
        ("checkpoint '7' not found",)),
    "heads: read-only workdir": lambda s: _on_copy(
        s, "heads_read_only", "attention.heads", ["--max_sentences", "4"],
        ("{workdir}/.lock", "read-only file system"), read_only=True),  # as evaluate.py
}
# Left by kills: temp files (`atomic_file`, and the legacy `.<name>.tmp<pid>`) and
# tokenizer temp folders (`temp_folder`, and the legacy `.tokenizer-tmp-*`).
LEFTOVER_FILES = (".config.json.abc123.tmp", ".metrics.jsonl.tmp4242",
                  "attention/.valid_step0000040_greedy.npz.q1w2e3r4.tmp")
LEFTOVER_FOLDERS = (".tokenizer.xyz.tmp", ".tokenizer-tmp-old")
LIVE = ".config.json.live0001.tmp"  # a writer that is still running: must survive


def _launch(case: Case):
    run = run_script if case.cli.endswith(".py") else run_module
    return run(case.cli, *case.argv, timeout=300, env=case.env)


@pytest.fixture(scope="module")
def surface(smoke_workdir, tmp_path_factory):
    """Runs every case, a resume over planted leftovers (item 1) and a --debug run, side
    by side. Returns {case id: (Case, result, snapshots before)}, and for "leftovers"
    (workdir, result, snapshot before planting) and "debug" (None, result, None)."""
    s = Setup(tmp_path_factory.mktemp("surface"), smoke_workdir)
    cases = {key: build(s) for key, build in CASES.items()}
    leftovers = s.copy("leftovers")
    clean = contents(leftovers)  # a resume rewrites config.json: same bytes, a new time
    for name in LEFTOVER_FILES:
        (leftovers / name).write_bytes(b"half a file")
    for name in LEFTOVER_FOLDERS:
        s.file(f"leftovers/{name}/spm.model", b"half a tokenizer")
    live = open(leftovers / LIVE, "wb")  # noqa: SIM115 - closed below
    fcntl.flock(live, fcntl.LOCK_EX)  # held as by a running atomic_file
    runs = {"leftovers": Case("train.py", [*SMOKE, "--workdir", str(leftovers)]),
            "debug": Case("attention.inspect", [str(s.root / "no.npz"), "--debug"]), **cases}
    before = {key: [snapshot(p) for p in case.watch] for key, case in cases.items()}
    smoke_before = snapshot(smoke_workdir)  # only read: checked below
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = dict(zip(runs, pool.map(_launch, runs.values()), strict=True))
    live.close()
    assert snapshot(smoke_workdir) == smoke_before
    out = {key: (case, results[key], before[key]) for key, case in cases.items()}
    out["leftovers"] = (leftovers, results["leftovers"], clean)
    out["debug"] = (None, results["debug"], None)
    yield out
    for lock in s.locks:  # held until the cases' folders have been compared
        lock.release()


@pytest.mark.parametrize("case_id", list(CASES))
def test_one_line_error(surface, case_id):
    case, result, before = surface[case_id]
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    report = f"{case.cli} {' '.join(case.argv)}\n{result.stderr[-3000:]}"
    assert result.returncode == 2, report
    assert "Traceback" not in result.stderr, report
    assert len(errors) == 1 and lines[-1] == errors[0], report
    for fragment in case.expect:
        assert fragment.lower() in errors[0].lower(), (fragment, errors[0])
    assert [snapshot(p) for p in case.watch] == before, f"{case_id} changed its input files"


def test_debug_shows_the_traceback_instead(surface):
    _, result, _ = surface["debug"]
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_resume_removes_temp_files_and_folders_left_by_a_kill(surface):
    """Item 1: `.<name>.<random>.tmp` files and folders (and the legacy names) left by a
    kill are removed when training starts again; a live writer's temp file and every
    other file are kept."""
    workdir, result, clean = surface["leftovers"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "finished training at step 40" in result.stderr  # cleaned, then nothing to do
    for name in (*LEFTOVER_FILES, *LEFTOVER_FOLDERS):
        assert not (workdir / name).exists(), name
    (workdir / LIVE).unlink()  # still there
    assert contents(workdir) == clean  # and no lock file left behind


@pytest.mark.parametrize("settings, message", [
    (dict(vocab_size=5), "data.vocab_size=5 is too small for the characters"),
    (dict(vocab_size=100_000), "data.vocab_size=100000 is too large"),
    (dict(vocab_size=50, character_coverage=0.5),
     "data.character_coverage=0.5 is out of range: failed check"),
])
def test_every_sentencepiece_training_failure_is_a_data_error(settings, message):
    """Item 3: each RuntimeError of SentencePiece -> one line, config key and reason."""
    from data.tokenizer import train_model  # here: its absence fails this test only
    text = [f"ein Hund Nummer {i}, der läuft." for i in range(200)]
    with pytest.raises(DataError, match=message) as info:
        train_model(text, **settings)
    assert "\n" not in str(info.value)
