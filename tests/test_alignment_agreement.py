"""Alignment by agreement (alignment.agreement): the heads' posteriors taken as the
gradient of their likelihood equal NumPy's forward-backward, the agreed posteriors by
hand, the term's gradient reaches the lexical tables alone, and alignment.agreement_start
gates it by step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from alignment.forced import HeadTerms, head_posterior
from alignment.head import agreed_posteriors, agreement_log_likelihood, head_posteriors
from data.tokenizer import PAD_ID
from tests.test_alignment_head import align_loss, smoke_align, toy_batch
from tests.test_alignment_reverse import PAIRS, reverse_model
from training.plugins import active_plugins
from training.step import create_train_state, make_train_step


@pytest.mark.parametrize("prefix,rows_key", [("alignment_", "tgt_out"),
                                             ("alignment_reverse_", "src")])
@pytest.mark.parametrize("prior_weight", [1.0, 0.5])
def test_head_posteriors_equal_numpy_forward_backward(prefix, rows_key, prior_weight):
    model = reverse_model()
    batch = toy_batch(PAIRS)
    terms = model.forward_with_alignment(batch["src"], batch["tgt_in"], batch["tgt_out"])[3]
    log_prior, log_lexical, bias = (terms[f"{prefix}{k}"]
                                    for k in ("log_prior", "log_lexical", "transition_bias"))
    rows = batch[rows_key] != PAD_ID
    got = np.asarray(head_posteriors(log_prior, log_lexical, log_lexical > -1e8, bias,
                                     rows.astype(np.float32), prior_weight))
    for b in range(len(PAIRS)):
        n = int(rows[b].sum())  # real rows, </s> included
        m = int((np.asarray(log_lexical)[b, 0] > -1e8).sum())  # columns, NULL included
        want = head_posterior(HeadTerms(*(np.asarray(x)[b, :n, :m] for x in (log_prior,
                                                                           log_lexical)),
                                        np.asarray(bias)[b, : m + 1, :m]), prior_weight)
        np.testing.assert_allclose(got[b, :n, :m], want, rtol=1e-4, atol=1e-5)
        assert np.all(got[b, n:] == 0) and np.all(got[b, :, m:] == 0)


def test_agreed_posteriors_by_hand():
    # rows: 2 target pieces and </s>; columns: 2 source pieces and NULL (the source </s>)
    posterior = np.array([[[0.6, 0.2, 0.2],
                           [0.3, 0.3, 0.4],
                           [0.1, 0.1, 0.8]]])
    # the other head: rows 2 source pieces and </s>; columns 2 target pieces and NULL
    other = np.array([[[0.5, 0.5, 0.0],
                       [0.0, 1.0, 0.0],
                       [0.2, 0.2, 0.6]]])
    real_rows, real_columns = np.array([[True, True, False]]), np.array([[True, True, False]])
    got = np.asarray(agreed_posteriors(posterior, other, real_rows, real_columns))
    # row 0: products (0.3, 0) share its 0.8 of real mass; row 1: (0.15, 0.3) share 0.6;
    # the </s> row and the NULL column keep their own
    np.testing.assert_allclose(got, [[[0.8, 0.0, 0.2],
                                      [0.2, 0.4, 0.4],
                                      [0.1, 0.1, 0.8]]], rtol=1e-6)
    # A row the other head gives nothing to stays as it was.
    other[0, :, 0] = 0.0
    got = np.asarray(agreed_posteriors(posterior, other, real_rows, real_columns))
    np.testing.assert_allclose(got[0, 0], [0.6, 0.2, 0.2], rtol=1e-6)


def test_the_term_trains_the_lexical_tables_alone():
    """The agreement term adds to the loss and its sums, and its gradient reaches only
    the two heads' lexical tables: translation and the jump biases get the same gradient
    with it or without it."""
    model = reverse_model()
    batch = toy_batch(PAIRS)
    terms = model.forward_with_alignment(batch["src"], batch["tgt_in"], batch["tgt_out"])[3]
    loss0, sums0 = align_loss(model, batch, 0.1)
    loss2, sums2 = align_loss(model, batch, 0.1, agreement=2.0)
    agreement = -float(agreement_log_likelihood(terms, batch["src"], batch["tgt_out"]))
    assert float(sums2["align_agreement_sum"]) == pytest.approx(agreement, rel=1e-5)
    assert agreement > 0 and "align_agreement_sum" not in sums0
    tokens = float(sums0["tokens"])
    assert float(loss2) == pytest.approx(float(loss0) + 2.0 * agreement / tokens, rel=1e-5)

    graphdef, params = nnx.split(model, nnx.Param)
    grads = {weight: jax.grad(lambda p, w=weight: align_loss(nnx.merge(graphdef, p), batch,
                                                            0.1, agreement=w)[0])(
        params.to_pure_dict()) for weight in (0.0, 1.0)}
    heads = {name: (grads[0.0].pop(name), grads[1.0].pop(name))
             for name in ("alignment_head", "alignment_reverse")}
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 grads[0.0], grads[1.0])  # translation: the same
    for without, with_term in heads.values():
        for name in ("jump", "null_jump"):
            np.testing.assert_allclose(without[name], with_term[name], rtol=1e-5, atol=1e-7)
        assert not np.allclose(without["output"]["embedding"], with_term["output"]["embedding"])
    assert jnp.isfinite(loss2)


def test_agreement_start_gates_the_term_by_step():
    """With alignment.agreement_start = 3, steps 0-2 move the parameters exactly as
    without agreement (and, once the warmup's learning rate is above 0, not as with it
    from step 0); step 3 moves them otherwise."""
    def train_state(**alignment):
        cfg = smoke_align(jumps=True, reverse=True, **alignment)
        cfg.model.update(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
                         num_decoder_layers=1, dropout=0.0)
        graphdef, state = create_train_state(cfg, 40, 40)
        return make_train_step(graphdef, cfg.train, plugins=active_plugins(cfg)), state

    batch = toy_batch(PAIRS)
    runs = {name: train_state(**train) for name, train in (
        ("gated", dict(agreement=2.0, agreement_start=3)),
        ("off", dict(agreement=0.0)), ("on", dict(agreement=2.0)))}
    states = {name: state for name, (_, state) in runs.items()}

    def same(a, b):
        return all(np.allclose(x, y, rtol=1e-6, atol=1e-7) for x, y in zip(
            jax.tree.leaves(states[a]["params"]), jax.tree.leaves(states[b]["params"]),
            strict=True))

    for number in range(4):
        for name, (step, _) in runs.items():
            states[name], metrics = step(states[name], batch)
            assert float(metrics["align_agreement_sum"] if name != "off" else 1) > 0
        if number < 3:
            assert same("gated", "off"), number
            assert number == 0 or not same("gated", "on"), number
        else:
            assert not same("gated", "off")
