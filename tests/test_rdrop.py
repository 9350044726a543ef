"""R-Drop (training/step.py): the symmetric KL and the whole loss against NumPy, the
alpha = 0 path unchanged, and a jitted step that trains with it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import base
from configs.model import ModelConfig
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from models.transformer import Transformer
from training.step import batch_loss, create_train_state, make_train_step, symmetric_kl_sum

BATCH = {"src": np.array([[5, 6, 7, EOS_ID, 0], [8, 9, EOS_ID, 0, 0]], np.int32),
         "tgt_in": np.array([[BOS_ID, 10, 11, 0], [BOS_ID, 12, 0, 0]], np.int32),
         "tgt_out": np.array([[10, 11, EOS_ID, 0], [12, EOS_ID, 0, 0]], np.int32)}


def np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def np_symmetric_kl(logits_p, logits_q, weights):
    """(KL(p||q) + KL(q||p)) / 2 per token, written as the two KLs, weighted and summed."""
    log_p, log_q = np_log_softmax(logits_p), np_log_softmax(logits_q)
    kl_pq = (np.exp(log_p) * (log_p - log_q)).sum(-1)
    kl_qp = (np.exp(log_q) * (log_q - log_p)).sum(-1)
    return float(((kl_pq + kl_qp) / 2 * weights).sum())


def np_smoothed_ce(logits, targets, smoothing):
    log_probs = np_log_softmax(logits)
    nll = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    return (1 - smoothing) * nll - smoothing * log_probs.mean(-1)


def model_with_dropout(dropout: float) -> tuple[nnx.GraphDef, dict]:
    config = ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, num_heads=2,
                         num_encoder_layers=1, num_decoder_layers=1, d_ff=32, dropout=dropout)
    graphdef, params = nnx.split(Transformer(config, rngs=nnx.Rngs(0)), nnx.Param)
    return graphdef, params.to_pure_dict()


def test_symmetric_kl_matches_numpy():
    rng = np.random.default_rng(0)
    p, q = rng.normal(size=(2, 2, 3, 7)).astype(np.float32) * 3
    weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    got = float(symmetric_kl_sum(jnp.asarray(p), jnp.asarray(q), jnp.asarray(weights)))
    want = np_symmetric_kl(p, q, weights)
    assert want > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert float(symmetric_kl_sum(jnp.asarray(p), jnp.asarray(p), jnp.asarray(weights))) == 0.0
    # Pad positions do not count, whatever their logits.
    q_pad = q.copy()
    q_pad[weights == 0] += 50.0
    np.testing.assert_allclose(float(symmetric_kl_sum(jnp.asarray(p), jnp.asarray(q_pad),
                                                      jnp.asarray(weights))), want, rtol=1e-5)


def test_loss_matches_numpy_with_two_dropout_passes():
    """The loss is (CE of both copies + alpha * symmetric KL) / 2N, from the logits of
    one forward pass over the doubled batch (the same dropout key)."""
    graphdef, params = model_with_dropout(0.3)
    model = nnx.merge(graphdef, params)
    key, alpha, smoothing = jax.random.key(3), 4.0, 0.1
    loss, sums = batch_loss(model, BATCH, smoothing, key, rdrop_alpha=alpha)
    doubled = {k: np.concatenate([v, v]) for k, v in BATCH.items()}
    logits, _ = model(jnp.asarray(doubled["src"]), jnp.asarray(doubled["tgt_in"]), dropout_rng=key)
    logits = np.asarray(logits, np.float32)
    weights = (doubled["tgt_out"] != PAD_ID).astype(np.float32)
    ce = (np_smoothed_ce(logits, doubled["tgt_out"], smoothing) * weights).sum()
    kl = np_symmetric_kl(logits[:2], logits[2:], weights[:2])
    assert kl > 1e-4  # the two copies drew different dropout masks
    np.testing.assert_allclose(float(sums["rdrop_kl_sum"]), kl, rtol=1e-4)
    np.testing.assert_allclose(float(sums["tokens"]), weights.sum())
    np.testing.assert_allclose(float(loss), (ce + alpha * kl) / weights.sum(), rtol=1e-5)


def test_without_dropout_the_copies_agree_and_alpha_zero_is_plain_loss():
    graphdef, params = model_with_dropout(0.0)
    model = nnx.merge(graphdef, params)
    plain, plain_sums = batch_loss(model, BATCH, 0.1)
    rdrop, sums = batch_loss(model, BATCH, 0.1, rdrop_alpha=5.0)
    assert "rdrop_kl_sum" not in plain_sums
    np.testing.assert_allclose(float(sums["rdrop_kl_sum"]), 0.0, atol=1e-6)
    np.testing.assert_allclose(float(rdrop), float(plain), rtol=1e-6)
    np.testing.assert_allclose(float(sums["tokens"]), 2 * float(plain_sums["tokens"]))


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_train_step_with_rdrop(alpha):
    cfg = base.get_config()
    cfg.model.update(d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                     d_ff=32, dropout=0.2)
    cfg.train.update(rdrop_alpha=alpha, warmup_steps=1)
    graphdef, state = create_train_state(cfg, 20, 20)
    before = jax.tree.map(np.array, state["params"])
    step = make_train_step(graphdef, cfg.train)
    for _ in range(2):  # the learning rate of step 0 is 0 (warmup)
        state, metrics = step(state, {k: jnp.asarray(v) for k, v in BATCH.items()})
    assert ("rdrop_kl_sum" in metrics) == (alpha > 0)
    if alpha:
        assert float(metrics["rdrop_kl_sum"]) > 0
    assert int(state["nonfinite_step"]) == -1
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - b).max()), state["params"], before)
    assert max(jax.tree.leaves(moved)) > 0
