"""A word-alignment head: a neural IBM/HMM-style mixture on top of the translation model.

Cross-attention is a *prior*: the row that predicts target piece y_j is computed before
y_j is known, so it says where the decoder looks, not which source piece y_j translates.
Statistical aligners (IBM models, HMM, eflomal) instead read the *posterior*

    p(i | x, y_<=j) = a(i | x, y_<j) t(y_j | x_i) / sum_i' a(i' | x, y_<j) t(y_j | x_i')

of a mixture model p(y_j | x, y_<j) = sum_i a(i | x, y_<j) t(y_j | x_i). This head is that
mixture with neural parts (in the spirit of the neural HMM of Wang et al. 2018 and the
alignment layers of Zenkel et al. 2020 / Chen et al. 2020):

  * the prior a(i | ...) is a single-head attention whose query is the decoder's final
    state at j (it has seen y_<j) and whose keys are the encoder's outputs (contextual,
    so it can learn jumps, monotonicity and fertility-like behaviour);
  * the lexical table t(y | x_i) is a softmax over the target vocabulary computed from the
    source piece's *embedding* alone (no context, no position): so a link can only be
    earned by what the source piece itself translates to, as in IBM models. The source
    `</s>` plays IBM's NULL word.

With `alignment.jumps` the prior also depends on where the previous target piece
went, as in the HMM aligners (Vogel et al. 1996; eflomal's second stage): the source
position of y_j is a hidden Markov chain with transitions

    a(i | i', x, y_<j) = softmax_i(prior_logits(j, i) + jump(i - i')),

a learned bias per jump width (clipped at +-MAX_JUMP pieces; NULL has its own, and the
chain leaves NULL by the prior alone). Its likelihood is the forward algorithm
(`hmm_log_likelihood`); its posterior is read by forward-backward
(alignment/forced.py). In the statistical aligners this chain is what takes IBM
model 1's 55.6 AER to 38.3 on the RWTH German-English gold set (eflomal -m 1 vs -m 2 on
the same text); the mixture's prior alone gains ~1.5.

With `alignment.attention_prior=False` the chain has no prior attention: its
transitions are softmax_i(jump(i - i')), a classical HMM aligner whose lexical table is
neural. With `alignment.reverse` a second head of this class (`reverse=True`)
models the other direction in the same run, p(x_i | y, x_<i): rows are source pieces,
states target positions (the target `</s>` its NULL), jump biases alone, a lexical table
t(x_i | y_j) over the source vocabulary read from the target piece's embedding; the two
heads' links are symmetrised as two aligners' are (alignment/command.py).

The head is trained by maximising log p(y_j | x, y_<j) over the training bitext, beside
the translation loss. Its inputs are `stop_gradient`-ed, so the translation model is the
same with or without it (its BLEU does not move); only the head's own parameters learn.
Alignments are read from the posterior (alignment/command.py `--layer alignment`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from configs.model import ModelConfig

NEG_INF = -1e9  # added to masked logits; finite, so fully masked (padding) rows stay NaN-free
MAX_JUMP = 16  # the HMM's jump widths, in pieces; longer jumps share the bias of +-MAX_JUMP
# The jump biases are JUMP_SCALE x their parameters: a handful of shared scalars whose
# natural size is several nats (log p(jump)), which Adam moves by about the learning rate
# per step -- unscaled, they had moved 0.03 after 250 steps (lr 3e-3 peak), while the
# neural prior's logits, which the same steps move in hundreds of weights together, had
# already decided everything.
JUMP_SCALE = 10.0


class AlignmentHead(nnx.Module):
    """The mixture's prior attention and lexical table (module docstring).

    Args:
      config: the model config; the head has d_model-sized projections, a d_ff hidden
        layer for the lexical features and its own [tgt_vocab, d_model] output table.
      reverse: the head of the other direction (alignment.reverse): its lexical
        table t(x_i | y_j) reads target pieces and scores source ones ([src_vocab,
        d_model] output table), and it has no prior attention (jump biases alone).
      jumps: the prior an HMM over source positions (alignment.jumps: jump biases).
      attention_prior: the prior attention from the decoder state in it
        (alignment.attention_prior).
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, reverse: bool = False,
                 jumps: bool = False, attention_prior: bool = True):
        d = config.d_model
        kw = dict(param_dtype=jnp.dtype(config.param_dtype), rngs=rngs)
        # The prior attention (None with attention_prior=False: a uniform prior,
        # the jump biases alone moving the chain, as in the classical HMM aligners).
        attention = attention_prior and not reverse
        vocab_size = config.src_vocab_size if reverse else config.tgt_vocab_size
        self.query_norm = nnx.LayerNorm(d, epsilon=1e-6, **kw) if attention else None
        self.query = nnx.Linear(d, d, **kw) if attention else None
        self.key = nnx.Linear(d, d, **kw) if attention else None
        self.lexical_up = nnx.Linear(d, config.d_ff, **kw)
        self.lexical_down = nnx.Linear(config.d_ff, d, **kw)
        self.lexical_norm = nnx.LayerNorm(d, epsilon=1e-6, **kw)
        self.output = nnx.Embed(vocab_size, d, **kw,
                                embedding_init=nnx.initializers.normal(d**-0.5))
        self.output_bias = nnx.Param(jnp.zeros((vocab_size,),
                                               jnp.dtype(config.param_dtype)))
        # The HMM's transition biases: one per jump width, and one for a jump to NULL
        # (zeros: the chain starts as the mixture, whose prior ignores the last link).
        self.jump = nnx.Param(jnp.zeros((2 * MAX_JUMP + 1,), jnp.dtype(config.param_dtype))) \
            if jumps else None
        self.null_jump = nnx.Param(jnp.zeros((), jnp.dtype(config.param_dtype))) \
            if jumps else None

    def log_terms(self, decoder_states: jnp.ndarray, memory: jnp.ndarray,
                  source_embeddings: jnp.ndarray, targets: jnp.ndarray,
                  mask: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        """(log a(i | x, y_<j), log t(y_j | x_i)) for every target row j and source piece i.

        decoder_states: [B, T, D], the final (normed) decoder state of the row predicting
        targets[:, j]; memory: [B, S, D] encoder outputs; source_embeddings: [B, S, D]
        token rows of the source (no positions); targets: int [B, T]; mask: bool
        [B, T, S], True where row j may link to piece i. All float inputs are taken as
        constants (stop_gradient). Returns two float32 [B, T, S], NEG_INF where masked
        (the prior's rows sum to 1 over the unmasked pieces; uniform without the prior
        attention, when decoder_states and memory are not read).
        """
        source_embeddings = jax.lax.stop_gradient(source_embeddings.astype(jnp.float32))
        if self.query is None:  # no prior attention: uniform over the unmasked pieces
            prior = jnp.zeros(mask.shape, jnp.float32)
        else:
            q = self.query(self.query_norm(jax.lax.stop_gradient(
                decoder_states.astype(jnp.float32))))  # [B, T, D]
            k = self.key(jax.lax.stop_gradient(memory.astype(jnp.float32)))  # [B, S, D]
            prior = jnp.einsum("btd,bsd->bts", q, k) / math.sqrt(q.shape[-1])
        log_prior = jax.nn.log_softmax(jnp.where(mask, prior, NEG_INF), axis=-1)

        h = source_embeddings + self.lexical_down(jax.nn.relu(self.lexical_up(source_embeddings)))
        h = self.lexical_norm(h)  # [B, S, D]: what source piece i translates to
        table, bias = self.output.embedding[...], self.output_bias[...]
        log_z = jax.nn.logsumexp(jnp.einsum("bsd,vd->bsv", h, table) + bias, axis=-1)  # [B, S]
        # Only the targets' columns of the [B, S, V] table are needed: score them directly.
        score = jnp.einsum("bsd,btd->bts", h, jnp.take(table, targets, axis=0))
        log_lexical = score + jnp.take(bias, targets)[..., None] - log_z[:, None, :]
        return log_prior, jnp.where(mask, log_lexical, NEG_INF)

    def joint(self, *args: jnp.ndarray) -> jnp.ndarray:
        """log a(i | x, y_<j) + log t(y_j | x_i): float32 [B, T, S], NEG_INF where masked;
        the arguments are those of `log_terms`."""
        return joint_from_terms(*self.log_terms(*args), args[-1])

    def transition_bias(self, null: jnp.ndarray) -> jnp.ndarray | None:
        """The HMM's jump biases (None without `alignment_jumps`).

        null: bool [B, S], True at each source's `</s>` (the NULL word). Returns float32
        [B, S + 1, S]: row 0 scores the first target piece's position as a jump from just
        before piece 0, row 1 + i' a jump from piece i'; into NULL `null_jump`, out of NULL
        0 (the prior alone decides); all times JUMP_SCALE.
        """
        if self.jump is None:
            return None
        width = null.shape[1]
        jumps = jnp.arange(width)[None, :] - jnp.arange(-1, width)[:, None]  # [S + 1, S]
        table = JUMP_SCALE * self.jump[...].astype(jnp.float32)
        bias = table[jnp.clip(jumps, -MAX_JUMP, MAX_JUMP) + MAX_JUMP]
        from_null = jnp.pad(null, ((0, 0), (1, 0)))  # [B, S + 1]: row 0 is the start
        bias = jnp.where(from_null[:, :, None], 0.0, bias[None])
        return jnp.where(null[:, None, :], JUMP_SCALE * self.null_jump[...].astype(jnp.float32),
                         bias)


def joint_from_terms(log_prior: jnp.ndarray, log_lexical: jnp.ndarray,
                     mask: jnp.ndarray) -> jnp.ndarray:
    """The mixture's joint from `AlignmentHead.log_terms`: [B, T, S], NEG_INF where masked."""
    return jnp.where(mask, log_prior + log_lexical, NEG_INF)


def mixture_log_likelihood(joint: jnp.ndarray) -> jnp.ndarray:
    """log p(y_j | x, y_<j) = logsumexp_i joint[..., j, i]: [B, T, S] -> [B, T]."""
    return jax.nn.logsumexp(joint, axis=-1)


def posterior(joint: jnp.ndarray) -> jnp.ndarray:
    """p(i | x, y_<=j): the joint normalised over source pieces, [B, T, S] (rows sum to 1)."""
    return jax.nn.softmax(joint, axis=-1)


def head_log_likelihood(log_prior: jnp.ndarray, log_lexical: jnp.ndarray, mask: jnp.ndarray,
                        bias: jnp.ndarray | None,
                        prior_weight: float | jnp.ndarray = 1.0) -> jnp.ndarray:
    """log p(y_j | x, y_<j) per target row: float32 [B, T] -- the mixture's (bias None), or
    the HMM's with `AlignmentHead.transition_bias`, with the prior (the transitions) raised
    to `prior_weight` and renormalised (0: uniform, IBM model 1). The terms as
    `AlignmentHead.log_terms` returns them, mask as it takes it."""
    if bias is None:
        log_prior = jax.nn.log_softmax(jnp.where(mask, prior_weight * log_prior, NEG_INF))
        return mixture_log_likelihood(joint_from_terms(log_prior, log_lexical, mask))
    return hmm_log_likelihood(log_prior, log_lexical, bias, mask, prior_weight)


def hmm_log_likelihood(log_prior: jnp.ndarray, log_lexical: jnp.ndarray, bias: jnp.ndarray,
                       mask: jnp.ndarray, prior_weight: float | jnp.ndarray = 1.0) -> jnp.ndarray:
    """The HMM's log p(y_j | x, y_<j) per target row by the forward algorithm: [B, T].

    log_prior, log_lexical: float32 [B, T, S] (`AlignmentHead.log_terms`); bias: [B, S + 1,
    S] (`transition_bias`); mask: bool [B, T, S]. The transition into piece i from i' at
    row j is log_softmax_i(w (log_prior[j, i] + bias[1 + i', i])) over the unmasked i
    (w = `prior_weight`; 0 gives uniform transitions, IBM model 1). The forward variables
    are renormalised at every row, so the log normalisers are the per-row conditionals and
    sum to the sentence's log-likelihood; rows past the target's end are computed but do
    not change the rows before them (callers weight them 0).
    """
    def transitions(prior_row, mask_row):  # [B, S], [B, S] -> [B, S + 1, S]
        scores = prior_weight * (prior_row[:, None, :] + bias)
        return jax.nn.log_softmax(jnp.where(mask_row[:, None, :], scores, NEG_INF), axis=-1)

    def row(previous, inputs):  # previous: [B, S + 1] log p(state before row j), normalised
        prior_row, lexical_row, mask_row = inputs
        predicted = jax.nn.logsumexp(previous[:, :, None] + transitions(prior_row, mask_row),
                                     axis=1)
        joint = jnp.where(mask_row, predicted + lexical_row, NEG_INF)  # [B, S]
        log_norm = jax.nn.logsumexp(joint, axis=-1)  # [B]
        after = jnp.pad(joint - log_norm[:, None], ((0, 0), (1, 0)), constant_values=NEG_INF)
        return after, log_norm

    batch, _, width = log_prior.shape
    start = jnp.full((batch, width + 1), NEG_INF, jnp.float32).at[:, 0].set(0.0)
    inputs = tuple(jnp.swapaxes(x, 0, 1) for x in (log_prior, log_lexical, mask))  # rows first
    _, log_norms = jax.lax.scan(row, start, inputs)
    return jnp.swapaxes(log_norms, 0, 1)


def head_posteriors(log_prior: jnp.ndarray, log_lexical: jnp.ndarray, mask: jnp.ndarray,
                    bias: jnp.ndarray | None, row_weights: jnp.ndarray,
                    prior_weight: float | jnp.ndarray = 1.0) -> jnp.ndarray:
    """The head's posteriors p(i_j = i | x, y) -- the HMM's forward-backward marginals, or
    the mixture's per-row posterior -- as constants: float32 [B, T, S], rows of weight 0
    all 0. They are the gradient of the weighted log-likelihood with respect to the log
    emissions (each log t(y_j | x_i) enters the likelihood once), so one backward pass of
    the forward algorithm gives them. Arguments as `head_log_likelihood`'s; row_weights
    float [B, T] (1 for a real target row)."""
    def total(lexical):
        return jnp.sum(head_log_likelihood(log_prior, lexical, mask, bias, prior_weight)
                       * row_weights)

    return jax.lax.stop_gradient(jax.grad(total)(log_lexical))


def agreed_posteriors(posterior: jnp.ndarray, other: jnp.ndarray, real_rows: jnp.ndarray,
                      real_columns: jnp.ndarray) -> jnp.ndarray:
    """One head's posterior moved toward the links the other head agrees with (Liang et
    al. 2006's agreement E-step: the product of the two directions' marginals): each
    real row keeps its NULL mass and shares the rest over the real columns in proportion
    to posterior[j, i] x other[i, j]; rows the other head gives no mass to, and the rows
    that are not real (</s>, padding), stay as they are.

    posterior: float [B, T, S] (rows j, columns i, NULL and padding columns included);
    other: float [B, S, T], the other direction's; real_rows: bool [B, T] (a real piece
    of the rows' side); real_columns: bool [B, S] (a real piece, not NULL or padding).
    Returns float32 [B, T, S], constant (stop-gradient), rows summing as posterior's."""
    real = real_rows[:, :, None] & real_columns[:, None, :]
    product = jnp.where(real, posterior * jnp.swapaxes(other, 1, 2), 0.0)
    kept = jnp.sum(jnp.where(real, posterior, 0.0), axis=-1, keepdims=True)  # not NULL's
    shared = jnp.sum(product, axis=-1, keepdims=True)
    agreed = jnp.where(real_columns[:, None, :], product * kept / jnp.maximum(shared, 1e-30),
                       posterior)
    use = real_rows[:, :, None] & (shared > 1e-30)
    return jax.lax.stop_gradient(jnp.where(use, agreed, posterior).astype(jnp.float32))


def agreed_pair(terms: dict, src: jnp.ndarray, tgt_out: jnp.ndarray,
                prior_weight: float | jnp.ndarray = 1.0) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Both heads' `agreed_posteriors`: (the forward head's, float32 [B, T, S]; the reverse
    head's, [B, S, T]), constants. One forward-backward pass of each chain.

    terms: the forward pass's "alignment_*" and "alignment_reverse_*" terms
    (`AlignmentTransformer.forward_with_alignment`, alignment/plugin.py); src: int [B, S]; tgt_out: int [B, T] (no
    packing: the chains need one pair per row)."""
    from data.tokenizer import EOS_ID, PAD_ID

    def posteriors(prefix: str, rows: jnp.ndarray) -> jnp.ndarray:
        lexical = terms[f"{prefix}log_lexical"]
        return head_posteriors(terms[f"{prefix}log_prior"], lexical, lexical > NEG_INF / 2,
                               terms[f"{prefix}transition_bias"],
                               (rows != PAD_ID).astype(jnp.float32), prior_weight)

    forward, reverse = posteriors("alignment_", tgt_out), posteriors("alignment_reverse_", src)
    real_tgt, real_src = (tgt_out != PAD_ID) & (tgt_out != EOS_ID), (src != PAD_ID) & (src != EOS_ID)
    return (agreed_posteriors(forward, reverse, real_tgt, real_src),
            agreed_posteriors(reverse, forward, real_src, real_tgt))


def agreement_log_likelihood(terms: dict, src: jnp.ndarray, tgt_out: jnp.ndarray,
                             prior_weight: float | jnp.ndarray = 1.0,
                             agreed: tuple[jnp.ndarray, jnp.ndarray] | None = None) -> jnp.ndarray:
    """The two heads' lexical tables scored on the links both directions agree on:
    sum q(i | j) log t(y_j | x_i) + sum q'(j | i) log t(x_i | y_j), q and q' each head's
    `agreed_posteriors` (constants). Maximised beside the likelihood it is the M-step of
    Liang et al. (2006)'s alignment by agreement for the emissions: each lexical table
    learns from the links the other direction supports too (the jumps learn from the
    likelihood alone).

    Arguments as `agreed_pair`'s, whose result `agreed` passes when the caller has it.
    Returns a float32 scalar (a sum).
    """
    agreed, r_agreed = agreed or agreed_pair(terms, src, tgt_out, prior_weight)
    return (jnp.sum(agreed * terms["alignment_log_lexical"])
            + jnp.sum(r_agreed * terms["alignment_reverse_log_lexical"]))
