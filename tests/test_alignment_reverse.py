"""The alignment head's reverse twin (alignment.reverse): target -> source in the
same run, its HMM over target positions against an enumeration of every path, its
lexical table context-free, its loss added, translation left alone, and that it learns
the toy reversal from the other side."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from alignment.head import JUMP_SCALE, MAX_JUMP
from alignment.plugin import AlignmentTransformer
from data.tokenizer import PAD_ID
from tests.test_alignment_head import align_loss, aligner, small_config, toy_batch
from tests.test_alignment_hmm import enumerate_chain, reversal_accuracy

PAIRS = [([5, 6, 7], [9, 8, 9]), ([5], [10, 11, 12])]  # target 9 twice in the first pair


def reverse_model(seed: int = 0) -> AlignmentTransformer:
    """A small model with both heads and random (non-zero) jump biases."""
    model = aligner(small_config(dropout=0.0), seed, jumps=True, reverse=True)
    rng = np.random.default_rng(seed)
    for head in (model.alignment_head, model.alignment_reverse):
        head.jump.value = jnp.asarray(rng.normal(size=2 * MAX_JUMP + 1) / JUMP_SCALE)
        head.null_jump.value = jnp.asarray(rng.normal() / JUMP_SCALE)
    return model


def test_the_reverse_chain_runs_over_target_positions():
    """Rows are source pieces (and </s>), columns target pieces with </s> as NULL; its
    per-row conditionals are those of every path enumerated in NumPy; the lexical column
    of a target piece depends on its token only; no prior attention."""
    model = reverse_model()
    assert model.alignment_reverse.query is None
    assert model.alignment_reverse.output.embedding.value.shape[0] == 40  # source vocabulary
    batch = toy_batch(PAIRS)
    _, _, reverse_ll, weights = model.forward_with_alignment(
        batch["src"], batch["tgt_in"], batch["tgt_out"], return_weights=True)
    B, S = batch["src"].shape
    T = batch["tgt_out"].shape[1]
    log_prior, log_lexical, bias = (np.asarray(weights[f"alignment_reverse_{k}"])
                                    for k in ("log_prior", "log_lexical", "transition_bias"))
    assert log_prior.shape == log_lexical.shape == (B, S, T) and bias.shape == (B, T + 1, T)
    assert np.asarray(reverse_ll).shape == (B, S)
    for b, (src, tgt) in enumerate(PAIRS):
        m, n = len(src) + 1, len(tgt) + 1  # with </s>
        np.testing.assert_allclose(log_prior[b, :, :n], -np.log(n), rtol=1e-6)  # uniform
        null = JUMP_SCALE * float(model.alignment_reverse.null_jump.value)
        np.testing.assert_allclose(bias[b, : n, n - 1], null, rtol=1e-6)  # into target </s>
        prefix, _ = enumerate_chain(log_prior[b, :m, :n], log_lexical[b, :m, :n],
                                    bias[b, : n + 1, :n], 1.0)
        np.testing.assert_allclose(np.asarray(reverse_ll)[b, :m], np.diff(prefix, prepend=0.0),
                                   rtol=1e-4, atol=1e-4)
    # Target 9 at columns 0 and 2 of pair 0: the same lexical column (no context).
    np.testing.assert_array_equal(log_lexical[0, :, 0], log_lexical[0, :, 2])
    assert not np.allclose(log_lexical[0, :, 0], log_lexical[0, :, 1])
    # A pair's own rows: each source token scored, padding columns masked.
    assert np.all(log_lexical[1, :, 4:] <= -1e8)


def test_the_loss_adds_the_reverse_head_and_translation_is_untouched():
    model = reverse_model()
    batch = toy_batch(PAIRS)
    _, forward_ll, reverse_ll, _ = model.forward_with_alignment(
        batch["src"], batch["tgt_in"], batch["tgt_out"])
    _, sums = align_loss(model, batch, 0.0)
    want = -(np.sum(np.asarray(forward_ll) * (batch["tgt_out"] != PAD_ID))
             + np.sum(np.asarray(reverse_ll) * (batch["src"] != PAD_ID)))
    assert float(sums["align_nll_sum"]) == pytest.approx(want, rel=1e-5)

    grads = {}
    for reverse in (False, True):
        model = aligner(small_config(dropout=0.0), jumps=True, reverse=reverse)
        graphdef, params = nnx.split(model, nnx.Param)

        def loss(p, graphdef=graphdef):
            return align_loss(nnx.merge(graphdef, p), batch, 0.1)[0]

        grads[reverse] = jax.grad(loss)(params.to_pure_dict())
    reverse_grads = grads[True].pop("alignment_reverse")
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(reverse_grads))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 grads[False], grads[True])  # translation and the forward head: the same


@pytest.mark.slow
def test_the_reverse_head_learns_the_toy_reversal():
    """Source piece i of the reversed toy bitext is target piece n - 1 - i: the reverse
    head's posterior finds it, and its most likely short jump is -1 too."""
    from tests.test_alignment_head import trained_on_toy_reversal

    model, test, weights = trained_on_toy_reversal(jumps=True, attention_prior=False,
                                                   reverse=True)
    jump = np.asarray(model.alignment_reverse.jump.value)
    assert int(np.argmax(jump[MAX_JUMP - 2: MAX_JUMP + 3])) - 2 == -1, jump
    assert reversal_accuracy(test, weights, "alignment_reverse_") > 0.95


def test_joint_posterior_is_the_heads_geometric_mean_by_hand():
    from alignment.forced import joint_posterior

    # 2 target pieces (+ </s> row) x 3 source pieces (+ NULL column), and the reverse
    # head's 3 source pieces (+ </s>) x 2 target pieces (+ NULL).
    forward = np.array([[0.5, 0.2, 0.2, 0.1],
                        [0.1, 0.1, 0.8, 0.0],
                        [0.0, 0.0, 0.0, 1.0]])
    reverse = np.array([[0.5, 0.3, 0.2],
                        [0.8, 0.1, 0.1],
                        [0.0, 0.2, 0.8],
                        [0.0, 0.0, 1.0]])
    expected = np.array([[0.5, 0.4, 0.0, 0.0],  # sqrt(.5 .5), sqrt(.2 .8), sqrt(.2 0)
                         [np.sqrt(0.03), np.sqrt(0.01), 0.4, 0.0],
                         [0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(joint_posterior(forward, reverse), expected, rtol=1e-6)
    # the same agreement read from the other side
    np.testing.assert_allclose(joint_posterior(reverse, forward)[:-1, :-1],
                               expected[:-1, :-1].T, rtol=1e-6)
