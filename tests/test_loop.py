"""The training loop's bookkeeping (training/loop.py): the periodic predicate, the loop state
saved in checkpoints, and a progress bar that tells the truth under a time budget."""

import re

import pytest
from conftest import run_script

from common.errors import UserError
from training.loop import (
    LoopState,
    check_resume_inputs,
    expected_last_step,
    finished_reason,
    itstime,
)


def test_itstime_every_n_steps_and_at_the_final_step():
    assert [s for s in range(1, 11) if itstime(s, 4)] == [4, 8]
    assert itstime(7, 4, final=True) and not itstime(7, 0)
    assert [s for s in range(1, 6) if itstime(s, 0, final=s == 5)] == [5]


def test_loop_state_round_trips_through_checkpoint_meta():
    meta = {"epoch": 2, "batch_index": 5, "best_bleu": 3.5, "best_step": 40, "bad_evals": 1,
            "train_seconds": 12.0, "data_sha256": "a", "tokenizer_sha256": "b",
            "state_crc32": 7}  # keys the loop does not own are ignored
    loop = LoopState.from_meta(meta)
    assert (loop.epoch, loop.batch_index, loop.best_step, loop.tokenizer_sha256) == (2, 5, 40, "b")
    assert LoopState.from_meta({}) == LoopState()


def test_resume_refuses_other_plugin_inputs_but_not_a_checkpoint_saved_without_them(tmp_path):
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer/tokenizer.json").write_text("{}")
    taught = LoopState(data_sha256="d", fingerprints={"teacher_links": "links-a"})
    check_resume_inputs(taught, 10, tmp_path, "d", {"teacher_links": "links-a"})
    for now in ({"teacher_links": "links-b"}, {}):
        with pytest.raises(UserError, match="the teacher_links file differs from the one "
                                            "checkpoint step 10 in .* was trained with"):
            check_resume_inputs(taught, 10, tmp_path, "d", now)
    # Saved before the fingerprint existed: nothing to compare.
    check_resume_inputs(LoopState(data_sha256="d"), 10, tmp_path, "d", {"teacher_links": "b"})
    # A checkpoint that kept it as its own field, before fingerprints were a dict.
    old = LoopState.from_meta({"data_sha256": "d", "teacher_links_sha256": "links-a"})
    assert old.fingerprints == {"teacher_links": "links-a"}
    assert LoopState.from_meta({"teacher_links_sha256": ""}).fingerprints == {}


def test_expected_last_step_under_a_time_budget():
    assert expected_last_step(10, 8000, 0, 5.0, 0.5) == 8000  # no budget
    # 60 minutes, 600 s spent, 1 s per step: 3,000 more steps.
    assert expected_last_step(600, 8000, 60, 600.0, 1.0) == 3601
    assert expected_last_step(600, 2000, 60, 600.0, 1.0) == 2000  # num_steps comes first
    assert expected_last_step(600, 8000, 1, 100.0, 1.0) == 601  # budget already spent


def test_finished_reason_of_each_stop():
    import ml_collections

    cfg = ml_collections.ConfigDict({"num_steps": 100, "max_minutes": 0.0, "patience": 0})
    assert finished_reason(99, LoopState(train_seconds=1e9, bad_evals=99), cfg) == ""
    assert finished_reason(100, LoopState(), cfg) == "train.num_steps (100) reached"
    cfg.max_minutes = 1.0
    assert finished_reason(50, LoopState(train_seconds=60.0), cfg) == ""  # not yet over
    assert finished_reason(50, LoopState(train_seconds=60.5), cfg) == "time budget"
    cfg.patience = 3
    assert finished_reason(50, LoopState(bad_evals=2), cfg) == ""
    assert finished_reason(50, LoopState(bad_evals=3), cfg) == "no validation BLEU gain in 3 evals"


def test_progress_bar_total_is_where_a_time_budget_stops_the_run(tmp_path):
    command = ("train.py", "--config", "configs/smoke.py", "--workdir", str(tmp_path / "run"),
               "--config.train.num_steps=100000", "--config.train.max_minutes=0.1",
               "--config.eval.every_steps=0", "--config.attention_maps.enabled=False")
    result = run_script(*command)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "stopping at step" in result.stdout and "time budget" in result.stdout
    done, total = map(int, re.findall(r"(\d+)/(\d+) \[", result.stderr)[-1])
    assert "stops after 0.1 min" in result.stderr
    assert total < 100000 and done <= total <= done + 50, (done, total)

    # The same command again: the budget is spent, so it trains nothing (it used to train
    # one more step and save it).
    steps = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir())
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    again = run_script(*command)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"finished training at step {done} (time budget); nothing to do" in again.stderr
    assert sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()) == steps
    assert steps[-1] == done and (tmp_path / "run" / "metrics.jsonl").read_text() == metrics


def test_learning_rate_schedule_at_every_step_including_zero():
    import ml_collections

    from training.schedules import learning_rate_schedule

    for schedule in ("inverse_sqrt", "cosine", "constant"):
        cfg = ml_collections.ConfigDict({"learning_rate": 0.01, "warmup_steps": 4,
                                         "num_steps": 20, "schedule": schedule})
        rates = [float(learning_rate_schedule(cfg)(step)) for step in range(12)]  # Python ints
        assert rates[0] == 0.0 and abs(rates[4] - 0.01) < 1e-9, schedule
        assert all(0 <= r <= 0.01 + 1e-9 for r in rates)
    cfg.schedule = "inverse_sqrt"
    assert abs(float(learning_rate_schedule(cfg)(16)) - 0.01 * (4 / 16) ** 0.5) < 1e-9


def test_checkpoint_hook_saves_sparse_then_the_last_saves_dense(monkeypatch):
    """checkpoint.every_steps 20 for a resume and last_every_steps 5 for the last 3 saves
    before step 40: saves at 20, then 30, 35, 40 (not 25: outside the last 15 steps), and
    after a validation; a run whose last saves are off saves every 20 alone."""
    import types

    from training import hooks
    from training.loop import LoopState

    assert [s for s in range(1, 41) if hooks.in_last_saves(s, 40, 3, 5)] == [30, 35, 40]
    assert not any(hooks.in_last_saves(s, 40, 3, 0) for s in range(1, 41))

    def saved_steps(last_saves, validated=()):
        saved = []
        monkeypatch.setattr(hooks.ckpt, "save", lambda manager, step, *a: saved.append(step))
        monkeypatch.setattr(hooks, "check_finite", lambda state, manager: None)
        saver = hooks.Saver(None, LoopState(), lambda step: "end" if step >= 40 else "",
                            lambda: 0.0, "bleu", last_saves)
        hook = hooks.Hook("checkpoint", 20, saver, also=saver.also_due)
        stop = types.SimpleNamespace(signum=0)
        for step in range(1, 41):
            tick = hooks.Tick(step, {}, step == 40, stop)
            tick.valid = {"bleu": 1.0} if step in validated else None
            hooks.run_hooks([hook], tick)
        return saved

    assert saved_steps((40, 3, 5)) == [20, 30, 35, 40]
    assert saved_steps((40, 3, 5), validated=(12,)) == [12, 20, 30, 35, 40]
    assert saved_steps((40, 3, 0)) == [20, 40]


def test_train_log_reports_the_windows_gradient_norm_mean_and_max_and_token_weighted_loss():
    """The log hook over three steps: loss is the window's sum over its tokens, and the
    gradient norm is the window's mean and maximum, not the last step's value (2.0 here)."""
    import types

    import jax.numpy as jnp

    from training import hooks

    written = []
    log = types.SimpleNamespace(write=lambda step, split, **values: written.append(values))
    progress = types.SimpleNamespace(set_postfix=lambda **kw: None)
    logger = hooks.MetricsLogger(log, lambda step: 0.5, types.SimpleNamespace(used=1.0), None,
                                 progress, lambda: 0.0)
    for loss_sum, tokens, grad_norm in ((6.0, 3, 1.0), (4.0, 1, 9.0), (2.0, 4, 2.0)):
        logger.add({"loss_sum": jnp.float32(loss_sum), "tokens": jnp.float32(tokens),
                    "grad_norm": jnp.float32(grad_norm)}, tokens, 0.0, epoch=1)
    logger(hooks.Tick(3, {"nonfinite_step": jnp.int32(-1)}, False, types.SimpleNamespace(signum=0)))
    (event,) = written
    assert event["loss"] == pytest.approx(12.0 / 8)
    assert event["grad_norm_mean"] == pytest.approx(4.0) and event["grad_norm_max"] == 9.0
    assert "grad_norm" not in event and event["learning_rate"] == 0.5
    logger.add({"loss_sum": jnp.float32(1.0), "tokens": jnp.float32(1), "grad_norm":
                jnp.float32(0.5)}, 1, 0.0, epoch=1)  # the next window starts afresh
    logger(hooks.Tick(4, {"nonfinite_step": jnp.int32(-1)}, False, types.SimpleNamespace(signum=0)))
    assert written[1]["grad_norm_mean"] == 0.5 and written[1]["grad_norm_max"] == 0.5


def test_the_log_reports_each_hooks_seconds_in_its_window_even_those_after_it_in_a_step():
    """run_hooks times every hook into the logger's dict; the log hook clears that dict in
    place, so a hook that runs after it in the same step (validation at a log step) is
    counted in the next window, not lost to a dict the log replaced."""
    import time
    import types

    import jax.numpy as jnp

    from training import hooks

    written = []
    log = types.SimpleNamespace(write=lambda step, split, **values: written.append(values))
    progress = types.SimpleNamespace(set_postfix=lambda **kw: None)
    logger = hooks.MetricsLogger(log, lambda step: 0.5, types.SimpleNamespace(used=1.0), None,
                                 progress, lambda: 0.0)
    slow = hooks.Hook("validate", 2, lambda tick: time.sleep(0.05))
    registered = [hooks.Hook("log", 2, logger), slow, hooks.Hook("never", 0, lambda tick: None)]
    stop = types.SimpleNamespace(signum=0)
    for step in range(1, 5):
        logger.add({"loss_sum": jnp.float32(1.0), "tokens": jnp.float32(1),
                    "grad_norm": jnp.float32(1.0)}, 1, 0.0, epoch=1)
        tick = hooks.Tick(step, {"nonfinite_step": jnp.int32(-1)}, False, stop)
        hooks.run_hooks(registered, tick, logger.hook_seconds)
    first, second = written
    assert first["seconds_in_validate"] == 0.0 and first["seconds_in_never"] == 0.0
    assert second["seconds_in_validate"] >= 0.05  # step 2's validation, after step 2's log
    assert second["seconds_in_log"] > 0 and second["seconds_in_never"] == 0.0


def test_train_hooks_log_last_so_a_run_ended_by_patience_logs_its_last_steps_and_save(monkeypatch):
    """train.py's hooks (training/hooks.py `train_hooks`): validation, then the save, then
    the log, each after the one before in a step. A run that patience ends at a
    validation between two logs (step 15, logs every 10) still writes a train event at
    step 15, holding steps 11-15 and the seconds of step 15's validation and save."""
    import time
    import types

    import jax.numpy as jnp
    import ml_collections

    from training import hooks
    from training.loop import LoopState

    cfg_train = ml_collections.ConfigDict({"num_steps": 100, "max_minutes": 0.0, "patience": 1,
                                           "patience_metric": "loss", "log_every_steps": 10})
    cfg = ml_collections.ConfigDict({"train": cfg_train, "eval": {"every_steps": 5},
                                     "checkpoint": {"every_steps": 50}})
    loop, ran, written = LoopState(), [], []
    monkeypatch.setattr(hooks, "check_finite", lambda state, manager: None)
    monkeypatch.setattr(hooks.ckpt, "save", lambda manager, step, *a: ran.append(("save", step)))

    def validation(tick):
        time.sleep(0.02)
        loss = {5: 2.0, 10: 1.0}.get(tick.step, 3.0)  # no gain at step 15: patience 1 is out
        loop.record_validation(tick.step, None, loss, "loss")
        tick.valid = {"loss": loss}
        ran.append(("validate", tick.step))

    def finished(step):
        return finished_reason(step, loop, cfg_train)

    log = types.SimpleNamespace(write=lambda step, split, **v: written.append({"step": step, **v}))
    logger = hooks.MetricsLogger(log, lambda step: 0.5, types.SimpleNamespace(used=1.0), None,
                                 types.SimpleNamespace(set_postfix=lambda **kw: None),
                                 lambda: 0.0)
    saver = hooks.Saver(None, loop, finished, lambda: 0.0, "loss")
    def logged(tick):
        ran.append(("log", tick.step))
        logger(tick)

    registered = hooks.train_hooks(cfg, lambda tick: None, validation, saver, logged, finished)
    assert [h.name for h in registered] == ["budget_clock", "validate", "checkpoint", "log"]
    stop = types.SimpleNamespace(signum=0)
    for step in range(1, 100):
        logger.add({"loss_sum": jnp.float32(2.0), "tokens": jnp.float32(1),
                    "grad_norm": jnp.float32(1.0)}, 1, 0.0, epoch=1)
        tick = hooks.Tick(step, {}, bool(finished(step)), stop)
        hooks.run_hooks(registered, tick, logger.hook_seconds)
        if finished(step):
            break
    assert step == 15 and finished(15).startswith("no validation loss gain")
    assert ran == [("validate", 5), ("save", 5), ("validate", 10), ("save", 10), ("log", 10),
                   ("validate", 15), ("save", 15), ("log", 15)]
    assert [e["step"] for e in written] == [10, 15]
    assert written[1]["seconds_in_validate"] >= 0.02  # step 15's, in step 15's event
    assert written[0]["seconds_in_validate"] >= 0.04  # steps 5 and 10's
    assert written[1]["loss"] == pytest.approx(2.0)  # the 5 steps since step 10's log
