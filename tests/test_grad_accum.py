"""Gradient accumulation (train.grad_accum_steps, training/accumulation.py): k micro-batches
update exactly as one batch of their concatenation, and a resume mid-accumulation is exact."""

import json

import numpy as np
import pytest
from conftest import run_script
from test_train import final_params, flat

MICRO = 2  # micro-batches per update
UPDATES = 3


def tiny_config(grad_accum_steps: int, warmup_steps: int):
    from configs import smoke

    cfg = smoke.get_config()
    cfg.model.dropout = 0.0  # the two runs must draw no different dropout masks
    cfg.model.attention_dropout = 0.0
    cfg.train.grad_accum_steps = grad_accum_steps
    cfg.train.warmup_steps = warmup_steps
    cfg.train.weight_decay = 0.01  # AdamW's decay is part of the update compared
    return cfg


def micro_batches(vocab: int = 50, rows: int = 4, length: int = 12) -> list[dict]:
    """UPDATES * MICRO batches of one shape whose real-token counts differ a lot (the
    padding differs), so token weighting and a plain mean of batch means disagree."""
    from data.batching import make_batch

    rng = np.random.default_rng(0)
    batches = []
    for b in range(UPDATES * MICRO):
        longest = length - 1 if b % 2 == 0 else 3  # full rows, or short ones
        sources = [list(rng.integers(4, vocab, rng.integers(2, longest))) + [3] for _ in range(rows)]
        targets = [list(rng.integers(4, vocab, rng.integers(1, longest))) for _ in range(rows)]
        batch = make_batch(sources, targets, range(rows), rows, length, length)
        batch.pop("num_tokens")
        batches.append(batch)
    return batches


def concatenated(batches: list[dict]) -> dict:
    return {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}


def train(cfg, batches: list[dict]):
    from training.step import create_train_state, make_train_step

    graphdef, state = create_train_state(cfg, 50, 50)
    step = make_train_step(graphdef, cfg.train)
    params_after = []
    for batch in batches:
        state, _ = step(state, batch)
        params_after.append(flat(state["params"]))
    return state, params_after


def gradient(cfg, batch: dict):
    """The gradient of the mean loss of `batch` at the initial parameters of `cfg`."""
    import jax
    from flax import nnx

    from training.step import batch_loss, create_train_state

    graphdef, state = create_train_state(cfg, 50, 50)
    return jax.grad(lambda p: batch_loss(nnx.merge(graphdef, p), batch,
                                         cfg.train.label_smoothing)[0])(state["params"])


def test_accumulated_micro_batches_equal_one_step_on_their_concatenation():
    batches = micro_batches()
    tokens = [int((b["tgt_out"] != 0).sum()) for b in batches]
    assert max(tokens) > 2 * min(tokens)  # else weighting would not be tested
    # One batch of k*B rows a step; its step counts are those of the accumulated run / k.
    one = tiny_config(grad_accum_steps=1, warmup_steps=2)
    big = [concatenated(batches[i:i + MICRO]) for i in range(0, len(batches), MICRO)]
    state_one, _ = train(one, big)
    accumulated = tiny_config(grad_accum_steps=MICRO, warmup_steps=2 * MICRO)
    state_acc, after_each = train(accumulated, batches)

    a, b = flat(state_one["params"]), flat(state_acc["params"])
    moved = max(float(np.abs(a[k] - after_each[0][k]).max()) for k in a)
    assert moved > 1e-3  # the updates did something worth comparing
    # An attention key's bias adds the same number to every score of a query, which
    # softmax ignores: its gradient is rounding noise (checked below), which Adam (eps 1e-9)
    # scales to full-size steps in both runs alike, so those two runs' values are noise too.
    noise = [key for key in a if "['key']['bias']" in key]
    assert len(noise) == 3  # encoder self, decoder self and cross attention
    for key in a:
        if key not in noise:
            np.testing.assert_allclose(b[key], a[key], rtol=2e-5, atol=2e-6, err_msg=key)
    assert all(np.abs(g).max() < 1e-6 for key, g in flat(gradient(one, big[0])).items()
               if key in noise)
    assert int(state_acc["opt_state"].micro_step) == 0  # it ended on an update
    # Between updates the parameters stay put: only every k-th micro-batch updates.
    for first in range(MICRO, len(batches), MICRO):  # an update's first micro-batch
        for key, value in after_each[first - 1].items():
            np.testing.assert_array_equal(after_each[first][key], value, err_msg=key)


def test_a_plain_mean_of_batch_means_would_differ():
    """The guard of the test above: without the token weights the result is not the
    concatenation's, so that test would fail on optax.MultiSteps' averaging."""
    import jax
    import optax

    from training.accumulation import accumulate_gradients

    grads = [{"w": np.array([1.0, 0.0], np.float32)}, {"w": np.array([0.0, 1.0], np.float32)}]
    tokens = [30.0, 10.0]
    for weights, expected in (([None, None], [0.5, 0.5]), (tokens, [0.75, 0.25])):
        opt = accumulate_gradients(optax.identity(), 2)  # hands on the mean gradient
        state = opt.init({"w": np.zeros(2, np.float32)})
        for g, n in zip(grads, weights, strict=True):
            updates, state = opt.update(g, state, None, **({} if n is None else {"tokens": n}))
        np.testing.assert_allclose(np.asarray(jax.device_get(updates["w"])), expected)


@pytest.mark.slow
def test_resume_in_the_middle_of_an_accumulation_is_exact(tmp_path):
    # 11 micro-batches: the checkpoint at step 11 holds one micro-batch's partial sum.
    common = ["--config", "configs/smoke.py", "--config.train.grad_accum_steps=2",
              "--config.checkpoint.every_steps=11", "--config.eval.every_steps=0",
              "--config.eval.max_sentences=4", "--config.attention_maps.enabled=False"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    result = run_script("train.py", *common, "--workdir", str(straight),
                        "--config.train.num_steps=22")
    assert result.returncode == 0, result.stderr[-2000:]
    first = run_script("train.py", *common, "--workdir", str(resumed),
                       "--config.train.num_steps=11")
    assert first.returncode == 0, first.stderr[-2000:]
    _, at_11 = final_params(resumed, 11)
    accumulator = at_11["opt_state"]
    # orbax gives the NamedTuple back as a dict or a list, as it stored it.
    micro_step = accumulator["micro_step"] if isinstance(accumulator, dict) else accumulator[0]
    token_sum = accumulator["token_sum"] if isinstance(accumulator, dict) else accumulator[2]
    assert int(micro_step) == 1 and float(token_sum) > 0  # mid-accumulation indeed
    second = run_script("train.py", *common, "--workdir", str(resumed),
                        "--config.train.num_steps=22")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming from step 11" in second.stderr

    (a, a_all), (b, b_all) = final_params(straight, 22), final_params(resumed, 22)
    for key, value in flat(a).items():
        np.testing.assert_allclose(flat(b)[key], value, atol=1e-6, err_msg=key)
    opt_a, opt_b = flat(a_all["opt_state"]), flat(b_all["opt_state"])
    assert opt_a.keys() == opt_b.keys()
    for key in opt_a:
        np.testing.assert_allclose(opt_b[key], opt_a[key], atol=1e-6, err_msg=key)
    config = json.loads((resumed / "config.json").read_text())
    assert config["train"]["grad_accum_steps"] == 2
