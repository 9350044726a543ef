"""The alignment student (alignment.student, alignment/student.py): its
attention against NumPy, its cross-entropy by hand, its loss taught by the heads'
agreed posteriors with translation's and the heads' gradients left alone, and that it
learns the toy reversal from its teachers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from alignment.head import agreed_pair
from alignment.student import AlignmentStudent, log_posteriors, shift_rows, student_cross_entropy
from data.tokenizer import EOS_ID, PAD_ID
from tests.test_alignment_head import (
    align_loss,
    aligner,
    np_layer_norm,
    np_log_softmax,
    small_config,
    toy_batch,
)
from tests.test_alignment_reverse import PAIRS, reverse_model


def test_shift_rows_moves_each_row_up_one():
    x = jnp.arange(2 * 3 * 2).reshape(2, 3, 2)
    got = np.asarray(shift_rows(x))
    np.testing.assert_array_equal(got[:, :2], np.asarray(x)[:, 1:])
    assert np.all(got[:, 2] == 0)


def test_student_matches_a_numpy_reference():
    rng = np.random.default_rng(0)
    student = AlignmentStudent(small_config(), rngs=nnx.Rngs(2))
    student.diagonal.value = jnp.asarray(rng.normal(size=student.diagonal.value.shape))
    student.lexical_weights.value = jnp.asarray([0.7, 0.2])
    p = jax.tree.map(np.asarray, nnx.state(student, nnx.Param).to_pure_dict())
    states, target_rows, memory, source_rows, forward_lexical, reverse_lexical = (
        rng.normal(size=s).astype(np.float32)
        for s in [(2, 3, 16), (2, 3, 16), (2, 5, 16), (2, 5, 16), (2, 3, 5), (2, 5, 3)])
    src_valid = np.array([[True] * 5, [True] * 3 + [False] * 2])  # 3 pieces, </s> included
    tgt_valid = np.array([[True] * 3, [True] * 2 + [False]])
    forward_lexical[1, :, 3:] = reverse_lexical[1, :, 2:] = -1e9  # as the heads mask them
    scores = student(*map(jnp.asarray, (states, target_rows, memory, source_rows,
                                        forward_lexical, reverse_lexical, src_valid,
                                        tgt_valid)))
    rows, columns = (np.asarray(x) for x in log_posteriors(scores, jnp.asarray(src_valid),
                                                           jnp.asarray(tgt_valid)))

    def next_row(x):  # row j reads row j + 1, the last row zeros
        return np.concatenate([x[:, 1:], np.zeros_like(x[:, :1])], axis=1)

    features = np.concatenate([states, next_row(states), target_rows, next_row(target_rows)],
                              axis=-1)
    q = np_layer_norm(features, p["query_norm"]["scale"], p["query_norm"]["bias"])
    q = q @ p["query"]["kernel"] + p["query"]["bias"]
    keys = np_layer_norm(np.concatenate([memory, source_rows], axis=-1),
                         p["key_norm"]["scale"], p["key_norm"]["bias"])
    k = keys @ p["key"]["kernel"] + p["key"]["bias"]
    want_scores = np.einsum("btd,bsd->bts", q, k) / 4.0
    lexical = (0.7 * np.where(forward_lexical > -1e8, forward_lexical, 0)
               + 0.2 * np.where(reverse_lexical > -1e8, reverse_lexical, 0).transpose(0, 2, 1))
    want_scores += lexical
    for b, (s_len, t_len) in enumerate(((5, 3), (3, 2))):  # the diagonal's bias
        for j in range(3):
            for i in range(5):
                distance = int(np.clip(np.round(i - j * s_len / t_len), -16, 16))
                want_scores[b, j, i] += p["diagonal"][distance + 16]
    np.testing.assert_allclose(np.asarray(scores), want_scores, rtol=1e-4, atol=1e-4)
    # read both ways: over the source pieces (rows), over the target pieces (columns)
    for got, mask, want in ((rows, np.broadcast_to(src_valid[:, None, :], (2, 3, 5)),
                             want_scores),
                            (columns, np.broadcast_to(tgt_valid[:, None, :], (2, 5, 3)),
                             want_scores.transpose(0, 2, 1))):
        np.testing.assert_allclose(got[mask], np_log_softmax(np.where(mask, want, -np.inf))[mask],
                                   rtol=1e-4, atol=1e-4)
        probs = np.exp(got)
        np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
        assert np.all(probs[~mask] == 0.0)


def test_student_cross_entropy_by_hand():
    log_student = jnp.log(jnp.array([[[0.5, 0.25, 0.25],
                                       [0.1, 0.8, 0.1],
                                       [0.2, 0.2, 0.6]]]))
    teacher = jnp.array([[[1.0, 0.0, 0.0],
                          [0.5, 0.5, 0.0],
                          [0.0, 0.0, 1.0]]])
    real = jnp.array([[True, True, False]])  # the last row (</s>) is not taught
    want = -(np.log(0.5) + 0.5 * np.log(0.1) + 0.5 * np.log(0.8))
    assert float(student_cross_entropy(log_student, teacher, real)) == pytest.approx(want)
    # Masked cells (NEG_INF) with no teacher mass add nothing.
    masked = log_student.at[0, 0, 2].set(-1e9)
    assert float(student_cross_entropy(masked, teacher, real)) == pytest.approx(want)


def test_the_student_learns_from_the_heads_and_leaves_the_rest_alone():
    """The loss adds the student's cross-entropies, its rows against the forward head's
    agreed posterior and its columns against the reverse head's, and its gradient
    reaches the student alone: translation and both heads get the same gradient as in
    the same model without it."""
    batch = toy_batch(PAIRS)
    grads, losses = {}, {}
    for with_student in (False, True):
        model = reverse_model()  # the same seed: the same parameters but the student's
        if with_student:
            model = aligner(small_config(dropout=0.0), jumps=True, reverse=True, student=True)
            nnx.update(model, nnx.state(reverse_model()))
        graphdef, params = nnx.split(model, nnx.Param)

        def loss(p, graphdef=graphdef):
            return align_loss(nnx.merge(graphdef, p), batch, 0.1)

        (losses[with_student], sums), grads[with_student] = jax.value_and_grad(
            loss, has_aux=True)(params.to_pure_dict())
        assert ("align_student_sum" in sums) == with_student
    terms = model.forward_with_alignment(batch["src"], batch["tgt_in"], batch["tgt_out"])[3]
    agreed = agreed_pair(terms, batch["src"], batch["tgt_out"])
    real = {k: (batch[k] != PAD_ID) & (batch[k] != EOS_ID) for k in ("src", "tgt_out")}
    taught = float(student_cross_entropy(terms["alignment_student_log_posterior"], agreed[0],
                                         real["tgt_out"])
                   + student_cross_entropy(terms["alignment_student_reverse_log_posterior"],
                                           agreed[1], real["src"]))
    assert float(sums["align_student_sum"]) == pytest.approx(taught, rel=1e-5) and taught > 0
    assert float(losses[True]) == pytest.approx(
        float(losses[False]) + taught / float(sums["tokens"]), rel=1e-5)
    student = grads[True].pop("alignment_student")
    assert "alignment_student" not in grads[False]
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(student))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 grads[False], grads[True])


@pytest.mark.slow
def test_the_student_learns_the_toy_reversal():
    """Trained beside its teachers on the reversed word-for-word toy bitext, the
    student's argmax finds the links as the heads' posterior does, read either way."""
    from tests.test_alignment_head import trained_on_toy_reversal

    _, test, weights = trained_on_toy_reversal(jumps=True, attention_prior=False,
                                               reverse=True, student=True)
    for name in ("alignment_student_log_posterior", "alignment_student_reverse_log_posterior"):
        best = np.asarray(weights[name]).argmax(-1)  # each piece of one side: the other's
        right = total = 0
        for r, (a, _) in enumerate(test):
            n = len(a)
            right += sum(int(best[r, j] == n - 1 - j) for j in range(n))
            total += n
        assert right / total > 0.95, (name, right / total)
