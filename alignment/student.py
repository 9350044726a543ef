"""An alignment layer that reads the translation model's context, taught by the two
alignment heads or by an outside aligner's links (alignment.student).

The heads of alignment/head.py are statistical aligners with neural parts: their
lexical tables see one source piece's embedding, IBM model 1's view, so a link is earned
by what that piece alone translates to. On the RWTH German-English gold set their joint
reading stopped at ~34 AER, and the posteriors themselves were the limit (docs/
alignment.md): the links a word needs are often not in its lexical evidence, while the
translation model's states, which have read both sentences, hold more.

The student is one attention from each target piece to the encoder's states, trained
to reproduce the heads' agreed posteriors (`alignment.head.agreed_posteriors`,
the forward head's posterior moved toward the links the reverse head supports): the
alignment layer of Garg et al. (2019), supervised there by GIZA++'s links, here by the
run's own heads, so no gold links and no outside aligner. Its one score matrix is read
both ways: normalised over the source pieces (the source `</s>` as NULL) it is taught
the forward head's agreed posterior, normalised over the target pieces (the target
`</s>` as NULL) the reverse head's, so the two directions share one set of scores and
their joint reading (`alignment.forced.joint_posterior`) is symmetric by
construction.

Its score for target piece y_j and source piece i adds three things:

  * a bilinear attention whose query reads the decoder state of row j (what the model
    expected, having read y_<j) and of row j + 1 (whose input is y_j itself) and the
    embeddings of y_j and of y_{j+1}, the next piece, so it knows the piece it aligns
    and some context on both sides, and whose key reads the encoder output at source
    piece i (contextual) and the piece's embedding;
  * the two heads' lexical evidence, log t(y_j | x_i) and log t(x_i | y_j), each times a
    learned weight (1/2 at the start: the student starts from IBM model 1's view of both
    heads, the attention learning what context adds);
  * a learned bias per distance from the diagonal, i - j S / T rounded and clipped at
    +-MAX_JUMP (S, T the two sides' lengths with `</s>`), the HMM's sense of place
    without its chain.

(A first version, the attention alone with y_{j+1}'s embedding but not y_j's, stayed
14 AER behind its teachers at 1,000 steps: docs/alignment.md.) Its inputs are
stop-gradient, like the heads', and its gradients are clipped apart from theirs and
translation's (`AlignmentPlugin.param_groups`, alignment/plugin.py), so translation and
the heads train exactly as without it.

With alignment.teacher_links the teacher is an outside aligner's word links instead (eflomal's,
symmetrised, as Garg et al. taught GIZA++'s; alignment/teacher_links.py makes them):
`link_teachers` turns each batch's piece links into the two readings' targets.

Read as `attention.align --layer alignment_student` (the rows: softmax over the source
pieces) or `--layer alignment_student_joint` (the geometric mean of the two readings).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from alignment.head import MAX_JUMP, NEG_INF
from configs.model import ModelConfig
from data.tokenizer import EOS_ID, PAD_ID


def shift_rows(x: jnp.ndarray) -> jnp.ndarray:
    """x[:, j + 1] at row j, zeros at the last row: [B, T, ...] -> [B, T, ...]."""
    return jnp.pad(x[:, 1:], [(0, 0), (0, 1)] + [(0, 0)] * (x.ndim - 2))


class AlignmentStudent(nnx.Module):
    """The student's query and key projections (module docstring).

    Args:
      config: the model config; the query reads 4 x d_model features (two decoder states,
        two target embeddings) and the key 2 x d_model (encoder output, source
        embedding), each layer-normed, projected to d_model.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d = config.d_model
        dtype = jnp.dtype(config.param_dtype)
        kw = dict(param_dtype=dtype, rngs=rngs)
        self.query_norm = nnx.LayerNorm(4 * d, epsilon=1e-6, **kw)
        self.key_norm = nnx.LayerNorm(2 * d, epsilon=1e-6, **kw)
        self.query = nnx.Linear(4 * d, d, **kw)
        self.key = nnx.Linear(2 * d, d, **kw)
        self.lexical_weights = nnx.Param(jnp.full((2,), 0.5, dtype))  # forward, reverse
        self.diagonal = nnx.Param(jnp.zeros((2 * MAX_JUMP + 1,), dtype))

    def __call__(self, decoder_states: jnp.ndarray, target_embeddings: jnp.ndarray,
                 memory: jnp.ndarray, source_embeddings: jnp.ndarray,
                 forward_lexical: jnp.ndarray, reverse_lexical: jnp.ndarray,
                 src_valid: jnp.ndarray, tgt_valid: jnp.ndarray) -> jnp.ndarray:
        """The link scores: float32 [B, T, S] (`log_posteriors` normalises them).

        decoder_states: [B, T, D], the final decoder state of the row predicting
        tgt_out[:, j] (unpacked rows: row j + 1's input is y_j); target_embeddings:
        [B, T, D], the rows of tgt_out (y_j at row j); memory: [B, S, D] encoder outputs;
        source_embeddings: [B, S, D]; forward_lexical: [B, T, S] log t(y_j | x_i) and
        reverse_lexical: [B, S, T] log t(x_i | y_j), the heads' (NEG_INF where masked);
        src_valid: bool [B, S], tgt_valid: bool [B, T] (pieces and `</s>`). All float
        inputs are constants (stop_gradient).
        """
        def constant(x):
            return jax.lax.stop_gradient(x.astype(jnp.float32))

        states, targets = constant(decoder_states), constant(target_embeddings)
        features = jnp.concatenate([states, shift_rows(states), targets, shift_rows(targets)],
                                   axis=-1)
        q = self.query(self.query_norm(features))  # [B, T, D]
        k = self.key(self.key_norm(jnp.concatenate([constant(memory),
                                                    constant(source_embeddings)], axis=-1)))
        scores = jnp.einsum("btd,bsd->bts", q, k) / math.sqrt(q.shape[-1])
        lexical = jnp.stack([constant(forward_lexical),
                             jnp.swapaxes(constant(reverse_lexical), 1, 2)], axis=-1)
        lexical = jnp.where(lexical > NEG_INF / 2, lexical, 0.0)  # masked later, not here
        scores = scores + lexical @ self.lexical_weights[...].astype(jnp.float32)
        s_len = jnp.sum(src_valid, axis=-1)[:, None, None].astype(jnp.float32)
        t_len = jnp.sum(tgt_valid, axis=-1)[:, None, None].astype(jnp.float32)
        rows = jnp.arange(scores.shape[1], dtype=jnp.float32)[None, :, None]
        columns = jnp.arange(scores.shape[2], dtype=jnp.float32)[None, None, :]
        distance = jnp.round(columns - rows * s_len / jnp.maximum(t_len, 1.0)).astype(jnp.int32)
        return scores + self.diagonal[...].astype(jnp.float32)[
            jnp.clip(distance, -MAX_JUMP, MAX_JUMP) + MAX_JUMP]


def log_posteriors(scores: jnp.ndarray, src_valid: jnp.ndarray,
                   tgt_valid: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The student's scores read both ways: (log p(i | j), float32 [B, T, S], normalised
    over the source pieces; log p(j | i), float32 [B, S, T], over the target pieces),
    NEG_INF where masked.

    scores: float [B, T, S]; src_valid: bool [B, S], tgt_valid: bool [B, T] (the pieces
    and `</s>`, each side's NULL; not padding). A padding row is normalised over the
    unmasked cells too (finite, never taught or read)."""
    forward = jnp.where(src_valid[:, None, :], scores, NEG_INF)
    reverse = jnp.where(tgt_valid[:, None, :], jnp.swapaxes(scores, 1, 2), NEG_INF)
    return jax.nn.log_softmax(forward, axis=-1), jax.nn.log_softmax(reverse, axis=-1)


def student_cross_entropy(log_student: jnp.ndarray, teacher: jnp.ndarray,
                          real_rows: jnp.ndarray) -> jnp.ndarray:
    """-sum over real rows j and pieces i of teacher[j, i] log p_student(i | j): a float32
    scalar (a sum, as the heads' likelihoods are).

    log_student: [B, T, S], one of `log_posteriors` (for the reverse reading [B, S, T],
    the sides swapped throughout); teacher: float [B, T, S], rows summing to 1
    (constants); real_rows: bool [B, T], the pieces taught (not `</s>`, not padding).
    Masked cells have teacher mass 0, so NEG_INF never multiplies a non-zero weight."""
    weights = jnp.where(real_rows[:, :, None], jax.lax.stop_gradient(teacher), 0.0)
    return -jnp.sum(weights * jnp.where(weights > 0, log_student, 0.0))


def link_teachers(links: jnp.ndarray, src: jnp.ndarray,
                  tgt_out: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """An outside aligner's piece links as the student's two teachers (alignment.teacher_links):
    (forward, float32 [B, T, S]; reverse, float32 [B, S, T]). Each real target piece's row
    spreads evenly over the real source pieces it is linked with or, linked with none,
    puts all its mass on the source `</s>`, the NULL word; the reverse rows the same over
    the target pieces. Rows of `</s>` and padding are never taught (student_cross_entropy
    masks them).

    links: uint8 [B, T, S], 1 where target piece j and source piece i are linked; src:
    int [B, S]; tgt_out: int [B, T]."""
    real_src = (src != PAD_ID) & (src != EOS_ID)
    real_tgt = (tgt_out != PAD_ID) & (tgt_out != EOS_ID)
    linked = links.astype(jnp.float32) * real_tgt[:, :, None] * real_src[:, None, :]

    def rows(m: jnp.ndarray, null: jnp.ndarray) -> jnp.ndarray:
        total = jnp.sum(m, axis=-1, keepdims=True)
        return jnp.where(total > 0, m / jnp.maximum(total, 1.0),
                         null[:, None, :].astype(jnp.float32))

    return rows(linked, src == EOS_ID), rows(jnp.swapaxes(linked, 1, 2), tgt_out == EOS_ID)
