"""Stopping and "best" on validation loss (train.patience_metric="loss", eval.decode=False):
the anchors' fairseq recipe validates by loss every epoch and stops after 10 without a
lower one. The bookkeeping (training/loop.py), the checkpoint ranking
(training/checkpoint.py) and a loss-only validation in a real run."""

import json

import jax.numpy as jnp
import ml_collections
import pytest
from conftest import run_script

from common.errors import UserError
from configs import smoke
from configs.validation import validate_config
from training import checkpoint as ckpt
from training.loop import LoopState, finished_reason


def test_record_validation_follows_the_patience_metric():
    by_loss = LoopState()
    for step, bleu, loss in [(10, 5.0, 3.0), (20, 7.0, 3.2), (30, 9.0, 2.9), (40, 8.0, 2.95)]:
        by_loss.record_validation(step, bleu, loss, "loss")
    # The loss fell at 10 and 30; BLEU, which rose at 20, does not reset the count.
    assert (by_loss.best_step, by_loss.bad_evals, by_loss.best_loss, by_loss.best_bleu) == \
        (30, 1, 2.9, 9.0)

    by_bleu = LoopState()
    for step, bleu, loss in [(10, 5.0, 3.0), (20, 7.0, 3.2), (30, 6.0, 2.9)]:
        by_bleu.record_validation(step, bleu, loss, "bleu")
    assert (by_bleu.best_step, by_bleu.bad_evals, by_bleu.best_loss) == (20, 1, 2.9)

    loss_only = LoopState()  # eval.decode=False: no BLEU at all
    for step, loss in [(10, 3.0), (20, 3.0), (30, 3.1)]:
        loss_only.record_validation(step, None, loss, "loss")
    assert (loss_only.best_step, loss_only.bad_evals, loss_only.best_bleu) == (10, 2, -1.0)


def test_patience_on_loss_ends_the_run_and_says_why():
    cfg = ml_collections.ConfigDict({"num_steps": 100, "max_minutes": 0.0, "patience": 2,
                                     "patience_metric": "loss"})
    loop = LoopState()
    for step, loss in [(10, 3.0), (20, 3.1)]:
        loop.record_validation(step, None, loss, "loss")
        assert finished_reason(step, loop, cfg) == ""
    loop.record_validation(30, None, 3.0, "loss")  # equal is no gain, as fairseq counts it
    assert finished_reason(30, loop, cfg) == "no validation loss gain in 2 evals"


def test_loss_ranked_checkpoints_keep_and_choose_the_lowest_loss(tmp_path):
    state = {"w": jnp.zeros(3)}
    manager = ckpt.make_manager(tmp_path / "checkpoints", keep=1)
    for step, loss in [(10, 2.0), (20, 1.5), (30, 1.8), (40, None)]:
        ckpt.save(manager, step, state, {}, None if loss is None else {"loss": loss})
    manager.wait_until_finished()
    # The last one (kept: keep=1) and the lowest loss (kept: best), none other.
    assert sorted(manager.all_steps()) == [20, 40]
    assert ckpt.choose_step(manager, "best") == 20

    by_bleu = ckpt.make_manager(tmp_path / "bleu", keep=1)
    for step, bleu in [(10, 20.0), (20, 25.0), (30, 22.0)]:
        ckpt.save(by_bleu, step, state, {}, {"bleu": bleu})
    by_bleu.wait_until_finished()
    assert ckpt.choose_step(by_bleu, "best") == 20 and sorted(by_bleu.all_steps()) == [20, 30]


def test_patience_on_bleu_without_decoding_is_refused():
    cfg = smoke.get_config()
    cfg.eval.decode, cfg.train.patience = False, 3
    with pytest.raises(UserError, match="eval.decode=False does not compute.*"
                                        "train.patience_metric=loss"):
        validate_config(cfg)
    cfg.train.patience_metric = "loss"
    validate_config(cfg)
    cfg.train.patience_metric = "chrf"
    with pytest.raises(UserError, match="train.patience_metric"):
        validate_config(cfg)


def test_a_loss_only_validation_run_ranks_its_checkpoints_by_loss(tmp_path):
    workdir = tmp_path / "run"
    result = run_script("train.py", "--config", "configs/smoke.py", "--workdir", str(workdir),
                        "--config.eval.decode=False", "--config.train.patience_metric=loss",
                        "--config.train.patience=100", "--config.eval.every_steps=10",
                        "--config.checkpoint.keep=1")
    assert result.returncode == 0, result.stderr[-2000:]
    valid = [m for m in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
             if m["split"] == "valid"]
    assert [m["step"] for m in valid] == [10, 20, 30, 40]
    # Nothing was decoded, and each event says so.
    assert all("bleu" not in m and m["decode"] == "none" and m["loss"] > 0 for m in valid)
    assert not list((workdir / "attention").glob("*.npz"))
    lowest = min(valid, key=lambda m: m["loss"])

    manager = ckpt.make_manager(workdir / "checkpoints", keep=1, read_only=True)
    assert ckpt.choose_step(manager, "best") == lowest["step"]
    meta = ckpt.restore_meta(manager, 40)
    assert meta["best_step"] == lowest["step"]
    assert meta["best_loss"] == pytest.approx(lowest["loss"]) and meta["best_bleu"] == -1.0
    assert f"(best loss {lowest['loss']:.4f} at step {lowest['step']})" in result.stdout
