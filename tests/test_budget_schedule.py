"""train.schedule = "cosine_budget": a cosine over the time budget, applied by the host as a
factor on each step's update (training/step.py budget_decay, train.py)."""

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import run_script

from configs import base
from data.tokenizer import BOS_ID, EOS_ID
from training.schedules import COSINE_END, budget_decay, learning_rate_schedule
from training.step import create_train_state, make_train_step

BATCH = {"src": np.array([[5, 6, 7, EOS_ID, 0], [8, 9, EOS_ID, 0, 0]], np.int32),
         "tgt_in": np.array([[BOS_ID, 10, 11, 0], [BOS_ID, 12, 0, 0]], np.int32),
         "tgt_out": np.array([[10, 11, EOS_ID, 0], [12, EOS_ID, 0, 0]], np.int32)}


def test_budget_decay_is_the_step_cosine_with_time_for_steps():
    """With seconds standing for steps, the factor traces optax's warmup-cosine schedule
    (warmup 4, end at 20) divided by its peak, and stays at its end past the budget."""
    cfg = ml_collections.ConfigDict({"learning_rate": 0.01, "warmup_steps": 4, "num_steps": 20,
                                     "schedule": "cosine"})
    cosine = learning_rate_schedule(cfg)
    for step in range(4, 26):
        np.testing.assert_allclose(budget_decay(step, 4.0, 20.0), float(cosine(step)) / 0.01,
                                   rtol=1e-5, err_msg=str(step))
    assert budget_decay(4.0, 4.0, 20.0) == 1.0 and budget_decay(12.0, 4.0, 20.0) == pytest.approx(0.505)
    assert budget_decay(99.0, 4.0, 20.0) == pytest.approx(COSINE_END)
    assert budget_decay(3.0, -1.0, 20.0) == 1.0  # warmup not over yet
    assert budget_decay(30.0, 25.0, 20.0) == pytest.approx(COSINE_END)  # warmup outlasted the budget


def test_lr_scale_multiplies_the_learning_rate():
    """A step with lr_scale s moves the parameters exactly as a step at s times the
    learning rate (weight decay included), from the same state."""
    def run(learning_rate: float, lr_scale) -> dict:
        cfg = base.get_config()
        cfg.model.update(d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                         d_ff=32, dropout=0.1)
        cfg.train.update(learning_rate=learning_rate, warmup_steps=1, schedule="constant",
                         weight_decay=0.1)
        graphdef, state = create_train_state(cfg, 20, 20)
        step = make_train_step(graphdef, cfg.train)
        batch = {k: jnp.asarray(v) for k, v in BATCH.items()}
        for _ in range(3):  # step 0 has learning rate 0 (warmup)
            state, _ = step(state, batch, lr_scale)
        return jax.tree.map(np.asarray, state["params"])

    scaled, halved, full = run(0.01, np.float32(0.5)), run(0.005, None), run(0.01, None)
    compared = 0
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(scaled), jax.tree.leaves(halved),
                            strict=True):
        # Key biases have an exact gradient of 0 (softmax ignores a constant per query):
        # Adam normalises their rounding noise, which differs between the two programs.
        if "['key']['bias']" not in jax.tree_util.keystr(path):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=jax.tree_util.keystr(path))
            compared += 1
    assert compared > 10
    assert max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(scaled),
                                                          jax.tree.leaves(full), strict=False)) > 1e-4


@pytest.mark.long  # 60 s of training: the budget counts compiling, which took 30 s of a
# 30 s budget once (cold cache, beside another test): 4 steps, too few to see the decay
def test_train_cosine_budget_decays_to_the_end_of_the_budget(tmp_path):
    workdir = tmp_path / "run"
    result = run_script("train.py", "--config", "configs/smoke.py", "--workdir", str(workdir),
                        "--config.train.num_steps=100000", "--config.train.max_minutes=1.0",
                        "--config.train.schedule=cosine_budget", "--config.train.warmup_steps=3",
                        "--config.train.log_every_steps=1", "--config.eval.every_steps=0",
                        "--config.attention_maps.enabled=False")
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["learning_rate"] for r in records if r["split"] == "train"]
    peak = max(rates)
    after_warmup = rates[3:]  # from step 4, the first after warmup
    assert len(after_warmup) > 10, len(rates)
    assert all(b <= a for a, b in zip(after_warmup, after_warmup[1:], strict=False))  # only falls
    assert after_warmup[-1] < 0.1 * peak  # near its end when the budget ran out
    assert "warning: train.num_steps" not in result.stderr  # the clock, not the cap, ended it


def test_cosine_budget_warns_when_the_step_cap_comes_first(tmp_path):
    # 5 steps of the smoke model take seconds: the cap, not the 30-minute budget, ends the
    # run, so its learning rate never decays; the run says so (once) and still finishes.
    result = run_script("train.py", "--config", "configs/smoke.py", "--workdir",
                        str(tmp_path / "run"), "--config.train.num_steps=5",
                        "--config.train.max_minutes=30", "--config.train.schedule=cosine_budget",
                        "--config.eval.every_steps=0", "--config.attention_maps.enabled=False")
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == ["warning: train.num_steps (5) ends this run before its 30-minute "
                        "budget, with the cosine_budget learning rate not yet decayed; raise "
                        "it to let the clock end the run"]


def test_cosine_budget_needs_a_time_budget(tmp_path):
    result = run_script("train.py", "--config", "configs/smoke.py", "--workdir",
                        str(tmp_path / "run"), "--config.train.schedule=cosine_budget")
    assert result.returncode != 0 and not (tmp_path / "run").exists()
    assert result.stderr.strip().splitlines()[-1].startswith("error: train.schedule=cosine_budget")
