"""Reliability: crash safety, signals, NaN guard, resume guard, damaged checkpoints and
one writer per workdir (common/workdir_lock.py: two trainings at once, a killed holder).

Every fault here is real: a train.py subprocess is killed (SIGKILL) while an orbax save
is in progress, inside validation and between steps, or stopped with SIGINT/SIGTERM,
and restarted with the same command; the final parameters must equal those of the
uninterrupted smoke run (the session's `smoke_workdir`, trained once and shared). Each
refused resume must give exactly one `error: ...` line on stderr, exit code 2 and leave
every existing file byte-for-byte unchanged. Bad input of every command (flags,
config, corpus, map files, paths) is tested in tests/test_error_surface.py.
"""

import gzip
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_module, run_script
from test_train import final_params, flat

from common.errors import UserError
from common.workdir_lock import WorkdirLock, read_holder
from configs import smoke
from configs.resume import check_resume_config

SMOKE = ("--config", "configs/smoke.py")
TIMEOUT = 300  # seconds, for any one wait on a subprocess
TMP_MARK = ".orbax-checkpoint-tmp"


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` (relative path -> content)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_one_line_error(result, code: int, *fragments: str) -> str:
    """Exactly one stderr line, `error: ...` containing every fragment; returns it."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr[-3000:]
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr, lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def train(*args: str, timeout: float = 180):
    return run_script("train.py", *SMOKE, *args, timeout=timeout)


def saved_steps(workdir: Path) -> list[int]:
    folder = workdir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def temporary_saves(workdir: Path) -> list[str]:
    folder = workdir / "checkpoints"
    return sorted(p.name for p in folder.iterdir() if TMP_MARK in p.name) if folder.is_dir() else []


def events(workdir: Path) -> list[tuple[int, str]]:
    """(step, split) of every complete metrics.jsonl line, in file order."""
    path = workdir / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines(keepends=True):
        if line.endswith("\n"):
            event = json.loads(line)
            out.append((event["step"], event["split"]))
    return out


@pytest.fixture
def trained(smoke_workdir, tmp_path) -> Path:
    """A private copy of the 40-step smoke workdir (checkpoints 20 and 40)."""
    workdir = tmp_path / "run"
    shutil.copytree(smoke_workdir, workdir)
    return workdir


class Training:
    """A train.py subprocess; stderr goes to a file so a chatty child never blocks on a pipe."""

    def __init__(self, args: list[str], log: Path):
        self.log = log
        self._stderr = open(log, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), *args], cwd=REPO,
                                     stdout=subprocess.DEVNULL, stderr=self._stderr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)
        self._stderr.close()

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, what: str, condition):
        """Polls `condition()` every 2 ms until it is truthy (returned); fails if the child exits."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            if self.proc.poll() is not None:
                pytest.fail(f"train.py exited ({self.proc.returncode}) before {what}:\n"
                            f"{self.stderr()[-3000:]}")
            time.sleep(0.002)
        pytest.fail(f"timed out waiting for {what}")

    def send(self, signum: int) -> int:
        """Sends `signum` to the child, which must still be running; returns its exit code."""
        assert self.proc.poll() is None, "the child finished before the planned kill point"
        self.proc.send_signal(signum)
        return self.proc.wait(timeout=TIMEOUT)


# --- crash safety -------------------------------------------------------------------

@pytest.mark.slow
def test_killed_and_interrupted_training_resumes_to_identical_parameters(smoke_workdir, tmp_path):
    """SIGKILL mid-save, inside validation and between steps, then SIGINT and SIGTERM, each
    followed by the same command; the end result equals the uninterrupted smoke run."""
    workdir = tmp_path / "crashy"
    args = [*SMOKE, "--workdir", str(workdir), "--config.checkpoint.every_steps=5"]
    runs = iter(range(100))
    timeline = []  # printed at the end (pytest shows it with -s or on failure)

    def start() -> Training:
        return Training(args, tmp_path / f"run{next(runs)}.log")

    def resumed_from(run: Training, expected: int | None) -> None:
        note = "starting" if expected is None else f"resuming from step {expected} "
        assert note in run.stderr(), run.stderr()[-2000:]

    # 1. SIGKILL while orbax writes a checkpoint (its temporary directory exists), once
    #    an earlier checkpoint is complete. Retried at the next save in the rare case the
    #    save completed between seeing the directory and the kill.
    expected = None
    for _attempt in range(2):
        with start() as run:
            tmp = run.wait_for("a checkpoint save in progress", lambda: next(
                (n for n in temporary_saves(workdir) if saved_steps(workdir)), None))
            assert run.send(signal.SIGKILL) == -signal.SIGKILL
            resumed_from(run, expected)
        expected = saved_steps(workdir)[-1]
        timeline.append(f"SIGKILL while saving {tmp}; complete: {saved_steps(workdir)}")
        if (workdir / "checkpoints" / tmp).exists():
            break
    else:
        pytest.fail("never killed train.py inside a checkpoint save")
    half_written = int(tmp.split(".")[0])
    assert half_written not in saved_steps(workdir) and half_written > expected

    # 2. SIGKILL inside validation: step 20's teacher-forced maps are written (its decoded
    #    ones are being recorded), its validation result is not.
    forced = workdir / "attention" / "valid_step0000020_teacher_forced.npz"
    with start() as run:
        run.wait_for("validation at step 20", lambda: forced.exists()
                     and (20, "valid") not in events(workdir))
        assert run.send(signal.SIGKILL) == -signal.SIGKILL
        resumed_from(run, expected)
    timeline.append(f"SIGKILL in validation at step 20; complete: {saved_steps(workdir)}")
    assert (20, "valid") not in events(workdir) and 20 not in saved_steps(workdir)
    assert not (workdir / "checkpoints" / tmp).exists()  # the half-written save was dropped
    expected = saved_steps(workdir)[-1]
    assert expected < 20

    # 3./4. SIGINT, then SIGTERM, each once a new save began (its temporary directory
    #    appeared; a finished one shows only when orbax commits it, steps later on a busy
    #    machine, which left no room for step 5): the step running then finishes, is
    #    saved, and the exit code and one line say so.
    def saving_after(step: int) -> bool:
        return any(int(name.split(".")[0]) > step for name in temporary_saves(workdir))

    for signum, code, name in ((signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")):
        with start() as run:
            run.wait_for("a new save", lambda before=expected: saving_after(before)
                         or saved_steps(workdir)[-1] > before)
            assert run.send(signum) == code, run.stderr()[-3000:]
            resumed_from(run, expected)
            last = run.stderr().strip().splitlines()[-1]
        match = re.fullmatch(rf"{name}: saved step (\d+) in {re.escape(str(workdir))}; "
                             "run the same command to resume", last)
        assert match, last
        stopped = int(match.group(1))
        timeline.append(f"{name} -> exit {code}, saved step {stopped}")
        assert stopped > expected and saved_steps(workdir)[-1] == stopped
        expected = stopped

    # 5. SIGKILL between steps, right after a new checkpoint appeared.
    with start() as run:
        run.wait_for("a new checkpoint", lambda: saved_steps(workdir)[-1] > expected)
        assert run.send(signal.SIGKILL) == -signal.SIGKILL
        resumed_from(run, expected)
    expected = saved_steps(workdir)[-1]
    timeline.append(f"SIGKILL between steps; complete: {saved_steps(workdir)}")
    assert expected < 40, timeline

    # 6. The same command once more finishes the run.
    with start() as run:
        assert run.proc.wait(timeout=TIMEOUT) == 0, run.stderr()[-3000:]
        resumed_from(run, expected)
    timeline.append(f"finished from step {expected}")
    print("\n".join(timeline))
    assert not temporary_saves(workdir)
    straight, straight_all = final_params(smoke_workdir, 40)
    resumed, resumed_all = final_params(workdir, 40)
    for a, b in ((flat(straight), flat(resumed)), (flat(straight_all["opt_state"]),
                                                   flat(resumed_all["opt_state"]))):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(a[key], b[key], atol=1e-6, rtol=0, err_msg=key)
    # Redone steps were dropped from metrics.jsonl: no (step, split) twice, steps increase.
    logged = events(workdir)
    assert len(logged) == len(set(logged))
    for split in ("train", "valid"):
        steps = [s for s, sp in logged if sp == split]
        assert steps == sorted(steps)
    assert {10, 20, 30, 40} <= {s for s, sp in logged if sp == "train"}
    assert [s for s, sp in logged if sp == "valid"] == [20, 40]


def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(smoke_workdir,
                                                                                 tmp_path):
    workdir = tmp_path / "nan"
    workdir.mkdir()
    shutil.copytree(smoke_workdir / "tokenizer", workdir / "tokenizer")  # skip retraining it
    # An absurd learning rate is enough: warmup makes step 1 a no-op, the next update
    # blows the parameters up, and the loss after it overflows.
    result = train("--workdir", str(workdir), "--config.train.learning_rate=1e30",
                   "--config.checkpoint.every_steps=1")
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    match = re.fullmatch(r"error: non-finite loss or gradient at step (\d+); stopped without saving "
                         r"\(last good checkpoint: step (\d+)\); .*", last)
    assert match and "Traceback" not in result.stderr, last
    bad, good = int(match.group(1)), int(match.group(2))
    assert good == bad - 1 and saved_steps(workdir)[-1] == good
    assert not temporary_saves(workdir)
    _, state = final_params(workdir, good)
    assert all(np.isfinite(v).all() for v in flat(state).values())
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        assert event["step"] < bad and all(np.isfinite(v) for v in event.values()
                                           if isinstance(v, float))


# --- resume guard -------------------------------------------------------------------

def test_resume_refuses_changed_shape_vocabulary_or_data_even_with_the_flag(trained):
    before = snapshot(trained)
    result = train("--workdir", str(trained), "--config.model.num_heads=4",
                   "--config.data.vocab_size=300", "--config.data.max_train_sentences=1000",
                   "--config.data.pack_length=64",
                   "--allow_config_change=model.num_heads,data.vocab_size,data.max_train_sentences,"
                   "data.pack_length")
    assert_one_line_error(result, 2, "model.num_heads: 2 -> 4", "data.vocab_size: 200 -> 300",
                          "data.max_train_sentences: 2000 -> 1000", "data.pack_length: 0 -> 64",
                          "cannot change on resume")
    assert snapshot(trained) == before


def test_resume_needs_the_flag_for_other_fields(trained):
    before = snapshot(trained)
    result = train("--workdir", str(trained), "--config.train.learning_rate=0.5",
                   "--config.train.num_steps=60")  # num_steps is always allowed
    assert_one_line_error(result, 2, "train.learning_rate: 0.001 -> 0.5",
                          "--allow_config_change=train.learning_rate")
    assert "num_steps" not in result.stderr
    assert snapshot(trained) == before


def test_resume_names_a_saved_key_this_code_does_not_have():
    """A run saved by code with an option since removed: the line says the key is gone."""
    new = smoke.get_config()
    saved = json.loads(json.dumps(new.to_dict()))
    saved["model"]["removed_option"] = False
    with pytest.raises(UserError, match=r"model\.removed_option: False -> \(not a key of "
                                        r"this code\)\); they cannot change on resume"):
        check_resume_config(saved, new, "runs/x")


def test_resume_accepts_a_config_saved_before_a_field_was_added(trained):
    """config.json written before model.embedding_grad existed: its default is no change,
    another value still needs the flag."""
    path = trained / "config.json"
    saved = json.loads(path.read_text())
    del saved["model"]["embedding_grad"]
    path.write_text(json.dumps(saved))
    result = train("--workdir", str(trained), "--config.model.embedding_grad=one_hot")
    assert_one_line_error(result, 2, "model.embedding_grad: None -> 'one_hot'",
                          "--allow_config_change=model.embedding_grad")
    result = train("--workdir", str(trained))  # num_steps (40) already reached
    assert result.returncode == 0, result.stderr[-2000:]
    assert "differs" not in result.stderr


def test_resume_refuses_changed_training_data_under_the_same_config(trained, tmp_path):
    data_dir = tmp_path / "multi30k"
    data_dir.mkdir()
    for name in ("train.de.gz", "train.en.gz", "val.de.gz", "val.en.gz"):
        shutil.copy(REPO / "data" / "multi30k" / name, data_dir / name)
    lines = gzip.decompress((data_dir / "train.en.gz").read_bytes()).decode().splitlines()
    lines[0] = "An edited first sentence."
    (data_dir / "train.en.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    before = snapshot(trained)
    result = train("--workdir", str(trained), f"--config.data.data_dir={data_dir}",
                   "--allow_config_change=data.data_dir")
    assert_one_line_error(result, 2, "training data differ", "checkpoint step 40")
    assert snapshot(trained) == before


def test_resume_refuses_a_replaced_tokenizer(trained):
    from data.corpora import read_lines
    from data.tokenizer import train_tokenizer

    # Same settings (tokenizer.json still matches), same vocabulary size, other text.
    text = read_lines(REPO / "data" / "multi30k" / "train.en.gz")[5000:8000]
    train_tokenizer(text, trained / "tokenizer" / "spm", vocab_size=200)
    before = snapshot(trained)
    result = train("--workdir", str(trained))
    assert_one_line_error(result, 2, f"tokenizer in {trained / 'tokenizer'}",
                          "not the one checkpoint step 40 was trained with")
    assert snapshot(trained) == before


# --- damaged checkpoints ------------------------------------------------------------

def _largest_data_file(step_dir: Path) -> Path:
    return max((p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"),
               key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("damage", ["truncated", "corrupted"])
def test_damaged_checkpoint_is_refused_and_left_alone(trained, damage):
    target = _largest_data_file(trained / "checkpoints" / "40")
    data = bytearray(target.read_bytes())
    if damage == "truncated":
        del data[len(data) // 2:]
    else:  # same size, garbage in the middle: only the CRC in meta can tell
        data[len(data) // 3: len(data) // 3 + 64] = bytes(range(64))
    target.write_bytes(bytes(data))
    before = snapshot(trained)
    result = train("--workdir", str(trained))
    line = assert_one_line_error(result, 2, f"checkpoint step 40 ({trained / 'checkpoints' / '40'})",
                                 "move it away to use step 20 instead", "nothing was deleted")
    # Garbage that lands in a compressed chunk fails to decode ("cannot be restored");
    # garbage that decodes is caught by the CRC. Either way the checkpoint is refused.
    assert "cannot be restored" in line or (damage == "corrupted" and "CRC-32" in line), line
    assert snapshot(trained) == before


def test_half_written_checkpoint_is_ignored(trained):
    """A leftover orbax temporary directory (as a kill mid-save leaves) is never restored."""
    fake = trained / "checkpoints" / f"60{TMP_MARK}"
    shutil.copytree(trained / "checkpoints" / "40", fake)
    result = train("--workdir", str(trained))  # 40 steps: nothing to train, restore only
    assert result.returncode == 0, result.stderr[-3000:]
    assert "finished training at step 40 (train.num_steps (40) reached)" in result.stderr
    assert not fake.exists() and saved_steps(trained) == [20, 40]


def test_a_created_manager_has_deleted_half_written_steps_a_read_only_one_leaves_them(tmp_path):
    """Deleted before `make_manager` returns, not by a thread a short run can outlive."""
    from training.checkpoint import make_manager

    fake = tmp_path / "checkpoints" / f"7{TMP_MARK}"
    (fake / "state").mkdir(parents=True)
    make_manager(tmp_path / "checkpoints", keep=1, read_only=True).close()
    assert fake.is_dir()
    manager = make_manager(tmp_path / "checkpoints", keep=1)
    assert not fake.exists()
    manager.close()


@pytest.mark.parametrize("host_copy", [True, False])
def test_a_save_from_the_host_copy_or_the_device_arrays_restores_the_same_state(tmp_path,
                                                                               host_copy):
    """`save`'s host copy (the state read to the host in one batch, train.py's way) and the
    device arrays handed to orbax: the same CRC, and both restore, as device arrays, to
    the saved values, step and meta."""
    import jax
    import jax.numpy as jnp

    from training import checkpoint as ckpt

    keys = iter(jax.random.split(jax.random.key(0), 4))
    state = {"step": jnp.asarray(7, jnp.int32), "nonfinite_step": jnp.asarray(-1, jnp.int32),
             "params": {"w": jax.random.normal(next(keys), (3, 5)),
                        "b": jax.random.normal(next(keys), (5,)).astype(jnp.bfloat16)},
             "opt_state": [{"mu": jax.random.normal(next(keys), (3, 5))}, {}]}
    manager = ckpt.make_manager(tmp_path / "checkpoints", keep=2)
    ckpt.save(manager, 7, state, {"epoch": 1}, host_copy=host_copy)
    manager.wait_until_finished()
    restored, meta = ckpt.restore(manager, 7, ckpt.abstract_of(state))
    assert meta == {"epoch": 1}  # restore checked the CRC saved with it, and popped it
    assert ckpt.restore_meta(manager, 7)[ckpt.CHECKSUM_KEY] == ckpt.state_checksum(state)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        assert isinstance(got, jax.Array) and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    manager.close()


def test_no_pickle_anywhere():
    sources = [p for p in REPO.rglob("*.py")
               if not {".venv", "build", ".git"} & set(p.relative_to(REPO).parts)]
    pattern = re.compile(r"^\s*(import|from)\s+(c?pickle|dill|cloudpickle|joblib)\b|"
                         r"allow_pickle\s*=\s*True|torch\.load", re.M)
    offenders = [str(p) for p in sources
                 if p != Path(__file__) and pattern.search(p.read_text(encoding="utf-8"))]
    assert not offenders


# --- one writer per run -------------------------------------------------------------

def test_workdir_lock_one_exclusive_or_many_shared_holders(tmp_path):
    """flock locks belong to an open file, so two holders in this process behave as two
    processes would: a second exclusive holder, or any holder beside an exclusive one, is
    refused naming the holder; shared holders share; the last to leave deletes the file."""
    workdir = tmp_path / "run"
    with WorkdirLock(workdir, purpose="training"):
        record = read_holder(workdir)
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        for shared in (False, True):
            with pytest.raises(UserError, match=rf"^{re.escape(str(workdir))} is in use by pid "
                                                rf"{os.getpid()} on host .+ since .+ \(.*training\); "
                                                r"wait$"):
                WorkdirLock(workdir, shared=shared, hint="wait").acquire()
    assert not workdir.exists()  # the lock made the folder; empty, it went with the lock
    workdir.mkdir()
    first = WorkdirLock(workdir, shared=True, purpose="evaluation").acquire()
    second = WorkdirLock(workdir, shared=True, purpose="evaluation").acquire()
    with pytest.raises(UserError, match="evaluation"):
        WorkdirLock(workdir).acquire()
    first.release()
    assert (workdir / ".lock").exists()  # the second one still holds it
    second.release()
    assert not (workdir / ".lock").exists()


def test_workdir_lock_left_by_a_killed_holder_is_free(tmp_path):
    """A holder killed with SIGKILL leaves its lock file, unlocked: the next one takes it."""
    workdir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from common.workdir_lock import WorkdirLock; "
        f"WorkdirLock({str(workdir)!r}).acquire(); print('held', flush=True); time.sleep(60)")],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"in use by pid {holder.pid} "):
            WorkdirLock(workdir).acquire()
    finally:
        holder.kill()
        holder.wait(timeout=TIMEOUT)
    assert read_holder(workdir)["pid"] == holder.pid  # its record is still there
    with WorkdirLock(workdir):
        assert read_holder(workdir)["pid"] == os.getpid()


def test_two_trainings_of_one_workdir_at_once_one_runs_and_the_other_is_refused(tmp_path):
    workdir = tmp_path / "twice"
    args = [*SMOKE, "--workdir", str(workdir), "--config.train.num_steps=10",
            "--config.eval.every_steps=10", "--config.checkpoint.every_steps=10"]
    with Training(args, tmp_path / "a.log") as a, Training(args, tmp_path / "b.log") as b:
        codes = {run: run.proc.wait(timeout=TIMEOUT) for run in (a, b)}
    assert sorted(codes.values()) == [0, 2], [run.stderr()[-2000:] for run in (a, b)]
    winner, loser = (a, b) if codes[a] == 0 else (b, a)
    lines = loser.stderr().strip().splitlines()
    assert len(lines) == 1, loser.stderr()[-3000:]
    assert re.fullmatch(rf"error: {re.escape(str(workdir))} is in use by pid {winner.proc.pid} "
                        rf"on host {re.escape(socket.gethostname())} since .+ "
                        r"\(train\.py, training\); one run has one writer: .+", lines[0]), lines[0]
    assert "starting" in winner.stderr()
    logged = events(workdir)  # one writer's events: none twice
    assert len(logged) == len(set(logged)) and (10, "train") in logged
    assert saved_steps(workdir) == [10] and not (workdir / ".lock").exists()


@pytest.mark.slow
def test_a_training_killed_with_sigkill_never_leaves_its_workdir_locked(tmp_path):
    """While a training runs a second start is refused naming it; once it is killed
    (SIGKILL: no clean-up of its own) the same command resumes it."""
    workdir = tmp_path / "killed"
    args = [*SMOKE, "--workdir", str(workdir), "--config.checkpoint.every_steps=5",
            "--config.eval.every_steps=1000", "--config.train.num_steps=1000"]
    with Training(args, tmp_path / "holder.log") as run:
        run.wait_for("a first checkpoint", lambda: saved_steps(workdir))
        before = snapshot(workdir / "tokenizer")
        refused = run_script("train.py", *args, timeout=TIMEOUT)
        assert_one_line_error(refused, 2, f"{workdir} is in use by pid {run.proc.pid} on host")
        assert run.send(signal.SIGKILL) == -signal.SIGKILL
    assert read_holder(workdir)["pid"] == run.proc.pid and snapshot(workdir / "tokenizer") == before
    saved = saved_steps(workdir)[-1]
    resumed = train(*args[2:], f"--config.train.num_steps={saved + 2}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from step {saved} " in resumed.stderr
    assert saved_steps(workdir)[-1] == saved + 2 and not (workdir / ".lock").exists()


def test_training_is_refused_while_an_evaluation_writes_into_the_workdir(trained):
    with WorkdirLock(trained, shared=True, purpose="evaluation"):
        before = snapshot(trained)
        result = train("--workdir", str(trained))
        assert_one_line_error(result, 2, f"{trained} is in use by pid {os.getpid()}",
                              "evaluation)")
        assert snapshot(trained) == before
    assert not (trained / ".lock").exists()


FIXTURES = Path(__file__).parent / "fixtures"
WRITERS_INTO_EVAL = {  # every command that writes into a run's eval/ by default
    "evaluate": ("evaluate.py", ["--split", "valid", "--max_sentences", "2"]),
    "heads": ("-m attention.heads", ["--max_sentences", "2"]),
    "align_select": ("-m attention.align", [
        "--select", "--pairs", str(FIXTURES / "rwth_de_en.head10.de-en"),
        "--gold", str(FIXTURES / "rwth_de_en.head10.talp"), "--dev_sentences", "2"]),
}


@pytest.mark.parametrize("command", sorted(WRITERS_INTO_EVAL))
def test_a_run_being_trained_is_not_written_into_by_any_command(trained, command):
    script, args = WRITERS_INTO_EVAL[command]
    with WorkdirLock(trained, purpose="training"):
        before = snapshot(trained)
        runner = run_module if script.startswith("-m ") else run_script
        result = runner(script.removeprefix("-m "), "--workdir", str(trained), *args,
                        timeout=TIMEOUT)
        assert_one_line_error(result, 2, f"{trained} is in use by pid {os.getpid()}",
                              "training)")
        assert snapshot(trained) == before
    assert not (trained / ".lock").exists()


def test_a_second_training_names_the_holder_before_reading_its_checkpoints(trained):
    """A training that holds the workdir may delete (keep=N) or be writing the very
    checkpoint a second start would read: the second start names the holder before it
    reads any. Here the newest checkpoint is half deleted, as one caught mid-deletion is."""
    shutil.rmtree(trained / "checkpoints" / "40" / "meta")
    with WorkdirLock(trained, purpose="training"):
        before = snapshot(trained)
        result = train("--workdir", str(trained))
        assert_one_line_error(result, 2, f"{trained} is in use by pid {os.getpid()}",
                              "one run has one writer")
        assert snapshot(trained) == before


def test_evaluations_share_a_workdir(trained):
    """Another evaluation holding the workdir (shared) does not stop this one."""
    with WorkdirLock(trained, shared=True, purpose="evaluation"):
        result = run_script("evaluate.py", "--workdir", str(trained), "--split", "valid",
                            "--max_sentences", "2", timeout=TIMEOUT)
        assert result.returncode == 0, result.stderr[-3000:]
        assert (trained / ".lock").exists()  # ours: the evaluation was not the last holder
    assert (trained / "eval" / "valid.step40.greedy.json").is_file()
    assert not (trained / ".lock").exists()
