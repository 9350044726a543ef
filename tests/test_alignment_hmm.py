"""The alignment head's HMM (alignment.jumps): its jump biases, the forward
algorithm's per-row likelihoods and the forward-backward posterior against sums over
every alignment enumerated in NumPy, and that it learns a known alignment."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from alignment.forced import HeadTerms, head_posterior
from alignment.head import (
    JUMP_SCALE,
    MAX_JUMP,
    AlignmentHead,
    hmm_log_likelihood,
    mixture_log_likelihood,
)
from configs.model import ModelConfig
from training.step import create_train_state, make_train_step


def jump_head(seed: int = 0) -> AlignmentHead:
    """A head with random jump biases (they start at zero)."""
    config = ModelConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=16, num_heads=2,
                         num_encoder_layers=1, num_decoder_layers=1, d_ff=32)
    head = AlignmentHead(config, rngs=nnx.Rngs(seed), jumps=True)
    rng = np.random.default_rng(seed)
    head.jump.value = jnp.asarray(rng.normal(size=2 * MAX_JUMP + 1) / JUMP_SCALE, jnp.float32)
    head.null_jump.value = jnp.asarray(-0.15, jnp.float32)
    return head


def test_transition_bias_reads_jump_widths_and_null():
    head = jump_head()
    jump, null_jump = (JUMP_SCALE * np.asarray(head.jump.value),
                       JUMP_SCALE * float(head.null_jump.value))
    null = np.zeros((1, 40), bool)
    null[0, 30] = True  # </s> after 30 pieces; the rest is padding
    bias = np.asarray(head.transition_bias(jnp.asarray(null)))[0]  # [41, 40]
    assert bias.shape == (41, 40)
    for frm, to in [(-1, 0), (-1, 5), (0, 1), (4, 4), (10, 3), (2, 25), (29, 0)]:
        want = jump[np.clip(to - frm, -MAX_JUMP, MAX_JUMP) + MAX_JUMP]
        assert bias[frm + 1, to] == pytest.approx(want), (frm, to)
    assert np.all(bias[:, 30] == null_jump)  # into NULL, from anywhere
    assert np.all(bias[31, :30] == 0.0)  # out of NULL: the prior alone
    assert head.jump.value.shape == (2 * MAX_JUMP + 1,)


def random_terms(rng, rows: int, cols: tuple[int, ...]):
    """Log prior, log lexical and mask [B, rows, max(cols)] for sources of `cols` pieces."""
    width = max(cols)
    mask = np.zeros((len(cols), rows, width), bool)
    for b, m in enumerate(cols):
        mask[b, :, :m] = True
    logits = rng.normal(size=mask.shape) * 2
    log_prior = np.where(mask, logits - np.log(np.where(mask, np.exp(logits), 0).sum(-1,
                                                                                      keepdims=True)), -1e9)
    log_lexical = np.where(mask, np.log(rng.uniform(0.01, 1.0, size=mask.shape)), -1e9)
    return log_prior.astype(np.float32), log_lexical.astype(np.float32), mask


def enumerate_chain(log_prior, log_lexical, bias, w):
    """Every alignment of one sentence ([T, S] terms, [S + 1, S] bias): (log p(y_<=j) for
    each j, the posterior marginals [T, S]), by brute force."""
    rows, cols = log_lexical.shape
    scores = w * (log_prior[:, None, :] + bias[None])  # [T, S + 1, S]
    moves = scores - np.log(np.exp(scores).sum(-1, keepdims=True))
    prefix = np.zeros(rows)
    marginals = np.zeros((rows, cols))
    for k in range(rows):
        total = 0.0
        for path in itertools.product(range(cols), repeat=k + 1):
            p = np.exp(sum(moves[j, (path[j - 1] + 1) if j else 0, path[j]] + log_lexical[j, path[j]]
                           for j in range(k + 1)))
            total += p
            if k == rows - 1:
                for j, i in enumerate(path):
                    marginals[j, i] += p
        prefix[k] = np.log(total)
    return prefix, marginals / marginals.sum(-1, keepdims=True)


@pytest.mark.parametrize("w", [1.0, 0.5, 0.0])
def test_forward_and_forward_backward_match_enumeration(w):
    rng = np.random.default_rng(1)
    head = jump_head(1)
    log_prior, log_lexical, mask = random_terms(rng, rows=4, cols=(4, 3))
    null = np.zeros((2, 4), bool)
    null[0, 3] = null[1, 2] = True  # each source's last piece is its </s>
    bias = np.asarray(head.transition_bias(jnp.asarray(null)))
    got = np.asarray(hmm_log_likelihood(*map(jnp.asarray, (log_prior, log_lexical, bias, mask)),
                                        prior_weight=w))  # [B, T]
    for b, m in enumerate((4, 3)):
        prefix, marginals = enumerate_chain(log_prior[b, :, :m], log_lexical[b, :, :m],
                                            bias[b, : m + 1, :m], w)
        np.testing.assert_allclose(got[b], np.diff(prefix, prepend=0.0), rtol=1e-4, atol=1e-4)
        terms = HeadTerms(log_prior[b, :, :m], log_lexical[b, :, :m], bias[b, : m + 1, :m])
        post = head_posterior(terms, w)
        np.testing.assert_allclose(post, marginals, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(post.sum(-1), 1.0, rtol=1e-5)


def test_without_jump_biases_the_chain_is_the_mixture():
    """Zero biases make every transition the prior itself: the mixture's likelihood, and
    per row the mixture's posterior (later rows carry no information back)."""
    rng = np.random.default_rng(2)
    log_prior, log_lexical, mask = random_terms(rng, rows=5, cols=(6, 4))
    bias = np.zeros((2, 7, 6), np.float32)
    got = hmm_log_likelihood(*map(jnp.asarray, (log_prior, log_lexical, bias, mask)))
    want = mixture_log_likelihood(jnp.where(jnp.asarray(mask), log_prior + log_lexical, -1e9))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    chain = head_posterior(HeadTerms(log_prior[1, :, :4], log_lexical[1, :, :4],
                                     bias[1, :5, :4]), 1.0)
    mixture = head_posterior(HeadTerms(log_prior[1, :, :4], log_lexical[1, :, :4], None), 1.0)
    np.testing.assert_allclose(chain, mixture, rtol=1e-4, atol=1e-6)


def test_padding_rows_do_not_change_the_rows_before_them():
    rng = np.random.default_rng(3)
    log_prior, log_lexical, mask = random_terms(rng, rows=6, cols=(5,))
    bias = np.asarray(jump_head(3).transition_bias(jnp.asarray(np.eye(1, 5, 4, dtype=bool))))
    full = np.asarray(hmm_log_likelihood(*map(jnp.asarray, (log_prior, log_lexical, bias, mask))))
    short = np.asarray(hmm_log_likelihood(*map(jnp.asarray, (log_prior[:, :4], log_lexical[:, :4],
                                                             bias, mask[:, :4]))))
    np.testing.assert_allclose(full[:, :4], short, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("attention_prior", [True, False])
def test_the_chain_learns_the_toy_reversal_and_its_jump(attention_prior):
    """Trained on the reversed word-for-word toy bitext, the HMM's posterior finds the
    links, and its most likely jump is -1 (each target word links one source word to
    the left of the previous one's) -- with the prior attention, and with the jump biases
    alone moving the chain (a classical HMM with a neural lexical table)."""
    from tests.test_alignment_head import trained_on_toy_reversal

    model, test, weights = trained_on_toy_reversal(jumps=True, attention_prior=attention_prior)
    jump = np.asarray(model.alignment_head.jump.value)
    # among the short jumps (the chain's start, from before piece 0 to the last source
    # word, is a jump of +3..+7 here, and scored by the same table)
    assert int(np.argmax(jump[MAX_JUMP - 2: MAX_JUMP + 3])) - 2 == -1, jump
    assert reversal_accuracy(test, weights, "alignment_") > 0.95


def reversal_accuracy(test, weights: dict, prefix: str) -> float:
    """How often the HMM posterior's argmax (of the terms named `prefix` + field in
    `weights`) is the toy reversal's link: piece j of n with piece n - 1 - j, either way."""
    right = total = 0
    for r, (a, _) in enumerate(test):
        n = len(a)
        terms = HeadTerms(*(np.asarray(weights[f"{prefix}{k}"])[r, : n + 1, : n + 1]
                            for k in ("log_prior", "log_lexical")),
                          np.asarray(weights[f"{prefix}transition_bias"])[r, : n + 2, : n + 1])
        best = head_posterior(terms).argmax(-1)
        right += sum(int(best[j] == n - 1 - j) for j in range(n))
        total += n
    return right / total


def test_without_the_prior_attention_the_prior_is_uniform_and_has_no_parameters():
    """alignment.attention_prior=False: no query / key parameters, log a(i) =
    -log(source length) on every row, and the jump biases still move the chain."""
    from tests.test_alignment_head import aligner, small_config, toy_batch

    model = aligner(small_config(dropout=0.0), jumps=True, attention_prior=False)
    head = model.alignment_head
    assert head.query is None and head.key is None and head.query_norm is None
    batch = toy_batch([([5, 6, 7], [9, 8]), ([5], [10, 11, 12])])
    _, _, _, weights = model.forward_with_alignment(batch["src"], batch["tgt_in"],
                                                 batch["tgt_out"], return_weights=True)
    cols = np.asarray((batch["src"] != 0).sum(-1))  # pieces + </s>
    log_prior = np.asarray(weights["alignment_log_prior"])
    for b, m in enumerate(cols):
        np.testing.assert_allclose(log_prior[b, :, :m], -np.log(m), rtol=1e-6)
    assert "alignment_transition_bias" in weights


@pytest.mark.parametrize("jumps", [False, True])
def test_prior_weight_zero_is_ibm_model_1_and_the_ramp_starts_there(jumps):
    """With the prior raised to 0 the head's likelihood is IBM model 1's (the mean of the
    lexical table over the source pieces), its prior and jumps get no gradient, and a
    train step with `alignment.prior_ramp_steps` uses that weight at step 0."""
    import jax

    from tests.test_alignment_head import align_loss, aligner, small_config, smoke_align, toy_batch
    from training.plugins import active_plugins

    model = aligner(small_config(dropout=0.0), jumps=jumps)
    batch = toy_batch([([5, 6, 7], [9, 8]), ([5], [10, 11, 12])])
    _, log_lik, _, weights = model.forward_with_alignment(
        batch["src"], batch["tgt_in"], batch["tgt_out"], return_weights=True, prior_weight=0.0)
    lexical = np.exp(np.minimum(np.asarray(weights["alignment_log_lexical"]), 0.0))
    cols = (batch["src"] != 0).sum(-1)[:, None]
    np.testing.assert_allclose(np.asarray(log_lik), np.log(lexical.sum(-1) / cols), rtol=1e-5)

    graphdef, params = nnx.split(model, nnx.Param)
    params = params.to_pure_dict()

    def loss(p, weight):  # the prior's weight at step weight * 10 of a 10-step ramp
        return align_loss(nnx.merge(graphdef, p), batch, 0.0, step=int(weight * 10),
                          prior_ramp_steps=10)

    for weight, prior_moves in ((0.0, False), (0.5, True)):
        (_, sums), grads = jax.value_and_grad(loss, has_aux=True)(params, weight)
        head = grads["alignment_head"]
        prior_grads = [head["query"]["kernel"], head["key"]["kernel"],
                       *([head["jump"]] if jumps else [])]
        assert all(bool(jnp.any(g != 0)) == prior_moves for g in prior_grads), weight
        assert bool(jnp.any(head["lexical_up"]["kernel"] != 0))
        if weight == 0.0:
            ibm1 = float(sums["align_nll_sum"])

    cfg = smoke_align(jumps=jumps, prior_ramp_steps=4)
    cfg.model.update(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
                     num_decoder_layers=1, dropout=0.0)
    graphdef, state = create_train_state(cfg, 40, 40)
    model = nnx.merge(graphdef, state["params"])
    want = float(align_loss(model, batch, cfg.train.label_smoothing,  # weight 0 at step 0
                            step=0)[1]["align_nll_sum"])
    _, metrics = make_train_step(graphdef, cfg.train, plugins=active_plugins(cfg))(state, batch)
    assert float(metrics["align_nll_sum"]) == pytest.approx(want, rel=1e-5)
    assert ibm1 > 0
