"""Beam search (cf. the Flax WMT example and GNMT, with fairseq/Hugging Face admission):
  * the encoder runs once per sentence; the cross-attention keys/values are projected
    once on the [B] memory and repeated to [B * beam]; only the self-attention caches
    are reordered when beams are reordered;
  * at the first step only one of the `beam_size` identical beams is live (others -inf);
  * each step ranks all beam x vocabulary extensions by their summed log-prob; the
    best `beam_size` extensions that do not end in eos become the new live beams; an
    extension ending in eos that ranks among the best `beam_size` moves to a separate
    store of `beam_size` finished hypotheses with its length-normalized score;
  * a sentence is done when its store is full and no live beam can beat the worst
    finished one: the best score a live beam can still reach is its log-prob (<= 0,
    and it only decreases) divided by the largest penalty of any length it can still
    reach (`max_length` for alpha >= 0, the next length for alpha < 0). A finished
    sentence takes no more hypotheses, so its result never depends on the batch;
  * at `max_length` the live beams enter the store too, unfinished, with the penalty
    of `max_length`, so something is always returned; the best hypothesis of the
    store is returned.
  * `beam_size=1` is greedy search (the same output as `greedy_search`; `scores` are
    then normalized with `length_penalty`).

The output, its shapes and the loop conventions are those of models/search.py.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from attention.cache import reorder_batch
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from models.search import (
    NEG_INF,
    SearchOutput,
    check_max_length,
    decoder_dims,
    greedy_search,
    next_log_probs,
    running,
    weight_buffers,
    write_row,
)
from models.transformer import DecodeState


class BeamState(NamedTuple):
    """The beam search loop carry (a pytree); cf. `BeamState` in Flax's examples/wmt.

    B sentences, K beams ("slots") per sentence, T = max_length, L decoder layers,
    H heads. The model sees the live beams flattened to B * K rows (row b * K + j).
    The finished store is K entries per sentence, unordered; an entry is found again
    from the back-pointers: its last token, the step and the live slot that fed it.
    The weights of a step are kept per slot fed (not per hypothesis), since beams are
    reordered every step; the returned hypothesis' rows are gathered at the end.
    """

    t: jnp.ndarray  # int32 []: the step, = tokens generated so far by every live beam
    last: jnp.ndarray  # int32 [B * K]: the token each live beam feeds at step t (bos first)
    live_lp: jnp.ndarray  # float32 [B, K]: summed log-prob of each live beam (-inf: none)
    decode_state: DecodeState  # B * K rows; self-attention caches follow their beams
    tok_hist: jnp.ndarray  # int32 [T, B, K]: token chosen at step t for live slot j
    par_hist: jnp.ndarray  # int32 [T, B, K]: its parent, the slot fed at step t
    fin_score: jnp.ndarray  # float32 [B, K]: finished store, normalized score (-inf: empty)
    fin_lp: jnp.ndarray  # float32 [B, K]: its summed log-prob
    fin_step: jnp.ndarray  # int32 [B, K]: step of its last token (length - 1)
    fin_slot: jnp.ndarray  # int32 [B, K]: the live slot fed at that step
    fin_tok: jnp.ndarray  # int32 [B, K]: its last token (eos, or any when cut at T)
    done: jnp.ndarray  # bool [B]: the store is final; it takes no more entries
    w_self: jnp.ndarray | None  # float32 [T, L, B * K, H, T]: step t, by slot fed; or None
    w_cross: jnp.ndarray | None  # float32 [T, L, B * K, H, S]: likewise; None without weights


def gnmt_penalty(length, alpha):
    """GNMT length penalty ((5 + length) / 6) ** alpha (length counts the eos)."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** jnp.asarray(alpha, jnp.float32)


def _follow_beams(state, parent: jnp.ndarray):
    """Rows `parent` [B * K] of the self-attention caches (of each ensemble member)."""
    if hasattr(state, "members"):
        return state._replace(members=tuple(_follow_beams(m, parent) for m in state.members))
    return DecodeState(reorder_batch(state.caches, parent), state.cross)


def beam_search(model, src, *, beam_size: int, length_penalty: float = 0.6, max_length: int,
                return_weights: bool = False, head_mask: dict | None = None) -> SearchOutput:
    """Beam search with GNMT length normalization (see the module docstring).

    Args:
      model: as in `greedy_search`.
      src: int32 [B, S] source ids.
      beam_size: static int >= 1; 1 runs `greedy_search`.
      length_penalty: alpha of ((5 + len) / 6) ** alpha; may be a traced scalar.
      max_length: static int, the most tokens per hypothesis (eos included).
      return_weights: also return the attention maps of the returned hypotheses.
      head_mask: as in `greedy_search` (per-row masks are over the B sentences).
    Returns:
      `SearchOutput` of the best hypothesis per sentence.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if beam_size == 1:
        out = greedy_search(model, src, max_length=max_length, return_weights=return_weights,
                            head_mask=head_mask)
        return out._replace(scores=out.log_probs / gnmt_penalty(out.lengths, length_penalty))
    return _beam_search(model, src, beam_size=beam_size, alpha=length_penalty,
                        max_length=max_length, return_weights=return_weights,
                        head_mask=head_mask)


def beam_search_nbest(model, src, *, beam_size: int, length_penalty: float = 0.6,
                      max_length: int) -> SearchOutput:
    """The `beam_size` hypotheses of each sentence's finished store, best score first: the
    n-best list a reranker or minimum-Bayes-risk selection (evaluation/mbr.py) chooses from.
    Entry 0 is `beam_search`'s hypothesis.

    Args: as in `beam_search` (beam_size >= 1 here runs the beam loop even for 1).
    Returns:
      `SearchOutput` with a K = beam_size axis after the batch: tokens int32 [B, K, T]
      (pad after each entry's last token), lengths int32 [B, K], log_probs and scores
      float32 [B, K]; weights None. An entry the search never filled (fewer than K
      hypotheses existed: a vocabulary smaller than the beam) has score -inf, length 0
      and comes last.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    return _beam_search(model, src, beam_size=beam_size, alpha=length_penalty,
                        max_length=max_length, return_weights=False, nbest=True)


def _beam_search(model, src, *, beam_size, alpha, max_length, return_weights, early_exit=True,
                 head_mask=None, nbest=False):
    """The beam search loop for any beam_size >= 1.

    With beam_size=1 it equals greedy search when alpha = 0; with alpha != 0 it may keep
    searching after greedy would stop (a live beam can still beat the finished one),
    which is why `beam_search` routes beam_size=1 to `greedy_search`. `early_exit=False`
    (tests only; a bool or a traced bool) ignores the bound and searches until max_length.
    `nbest=True` returns the whole finished store instead (`beam_search_nbest`).
    """
    src = jnp.asarray(src, jnp.int32)
    batch, src_len = src.shape
    k, steps = int(beam_size), check_max_length(max_length)
    alpha = jnp.asarray(alpha, jnp.float32)
    masked = {} if head_mask is None else {"head_mask": head_mask}  # only models that mask
    memory, src_valid, enc_w = model.encode(src, return_weights=return_weights, **masked)
    state = model.init_decode_state(memory, src_valid, steps)  # cross K/V projected once per sentence
    state = jax.tree.map(lambda x: x if x.ndim == 0 else jnp.repeat(x, k, axis=0), state)
    if head_mask is not None:  # per-sentence masks [L, B, H] -> per beam [L, B*K, H]
        masked = {"head_mask": {kind: m if m.ndim == 2 else jnp.repeat(m, k, axis=1)
                                for kind, m in head_mask.items()}}
    num_layers, num_heads = decoder_dims(state)
    rows = jnp.arange(batch)[:, None]
    max_len_penalty = gnmt_penalty(steps, alpha)
    w_self, w_cross = weight_buffers(return_weights, (steps, num_layers, batch * k, num_heads),
                                      steps, src_len)
    s = BeamState(
        t=jnp.zeros((), jnp.int32),
        last=jnp.full((batch * k,), BOS_ID, jnp.int32),
        live_lp=jnp.full((batch, k), NEG_INF, jnp.float32).at[:, 0].set(0.0),
        decode_state=state,
        tok_hist=jnp.zeros((steps, batch, k), jnp.int32),
        par_hist=jnp.zeros((steps, batch, k), jnp.int32),
        fin_score=jnp.full((batch, k), NEG_INF, jnp.float32),
        fin_lp=jnp.full((batch, k), NEG_INF, jnp.float32),
        fin_step=jnp.zeros((batch, k), jnp.int32),
        fin_slot=jnp.zeros((batch, k), jnp.int32),
        fin_tok=jnp.zeros((batch, k), jnp.int32),
        done=~src_valid.any(axis=1),  # all-pad filler rows: nothing to decode
        w_self=w_self,
        w_cross=w_cross,
    )

    def body(s: BeamState) -> BeamState:
        t, done = s.t, s.done
        lp, state, w = next_log_probs(model, s, return_weights, masked)
        vocab = lp.shape[-1]
        cand = (s.live_lp[:, :, None] + lp.reshape(batch, k, vocab)).reshape(batch, k * vocab)
        # >= k of the best 2k do not end in eos. (The barrier keeps XLA from folding the
        # slices below into the sort, which defeats its TopK rewrite: a full sort of
        # k * V per step otherwise, ~100x slower on CPU. `t` rides along so the barrier's
        # operand is a new tuple, not TopK's own: on two CPU devices XLA's TopK
        # decomposer aborts the compiler on a barrier that consumes TopK directly.)
        top_lp, top_idx, _ = jax.lax.optimization_barrier((*jax.lax.top_k(cand, 2 * k), t))
        top_tok, top_par = top_idx % vocab, top_idx // vocab
        is_eos = top_tok == EOS_ID

        # new live beams: the best k extensions that do not end in eos
        live_lp, pick = jax.lax.top_k(jnp.where(is_eos, NEG_INF, top_lp), k)
        live_tok = jnp.take_along_axis(top_tok, pick, axis=1)
        live_par = jnp.take_along_axis(top_par, pick, axis=1)

        # candidates for the finished store: eos extensions ranked within the best k,
        # and at the last step the live beams themselves (unfinished)
        open_ = ~done[:, None]
        eos_score = jnp.where(is_eos[:, :k] & open_, top_lp[:, :k] / gnmt_penalty(t + 1, alpha), NEG_INF)
        unf_score = jnp.where((t == steps - 1) & open_, live_lp / max_len_penalty, NEG_INF)
        step = jnp.full((batch, k), t, jnp.int32)
        score, pick = jax.lax.top_k(  # ties keep the earlier (already stored) entry
            jnp.concatenate([s.fin_score, eos_score, unf_score], axis=1), k)

        def merge(old, eos_val, unf_val):
            return jnp.take_along_axis(jnp.concatenate([old, eos_val, unf_val], axis=1), pick, axis=1)

        # done: the store is full and no live beam can beat its worst entry
        next_len = jnp.minimum(t + 2, steps)
        best_reachable = jnp.max(live_lp, axis=1) / jnp.maximum(gnmt_penalty(next_len, alpha),
                                                                max_len_penalty)
        done = done | (jnp.asarray(early_exit) & (jnp.min(score, axis=1) >= best_reachable))

        flat_parent = (rows * k + live_par).reshape(-1)
        return BeamState(
            t=t + 1,
            last=live_tok.reshape(-1),
            live_lp=live_lp,
            decode_state=_follow_beams(state, flat_parent),
            tok_hist=write_row(s.tok_hist, live_tok, t, axis=0),
            par_hist=write_row(s.par_hist, live_par, t, axis=0),
            fin_score=score,
            fin_lp=merge(s.fin_lp, top_lp[:, :k], live_lp),
            fin_step=merge(s.fin_step, step, step),
            fin_slot=merge(s.fin_slot, top_par[:, :k], live_par),
            fin_tok=merge(s.fin_tok, top_tok[:, :k], live_tok),
            done=done,
            w_self=write_row(s.w_self, w["decoder_self"], t, axis=0) if return_weights else None,
            w_cross=write_row(s.w_cross, w["cross"], t, axis=0) if return_weights else None,
        )

    s = jax.lax.while_loop(running(steps), body, s)

    if nbest:  # every store entry, best first; entries never filled stay at -inf, last
        order = jnp.argsort(-s.fin_score, axis=1)

        def ranked(x):  # [B, K] -> [K, B]
            return jnp.take_along_axis(x, order, axis=1).T

        tokens, _ = jax.vmap(lambda e, sl, tk: _backtrack(s, e, sl, tk))(
            ranked(s.fin_step), ranked(s.fin_slot), ranked(s.fin_tok))  # [K, T, B]
        return SearchOutput(jnp.transpose(tokens, (2, 0, 1)).astype(jnp.int32),
                            _lengths(ranked(s.fin_step), ranked(s.fin_score)).T,
                            ranked(s.fin_lp).T, ranked(s.fin_score).T, None)

    best = jnp.argmax(s.fin_score, axis=1)[:, None]

    def take(x):
        return jnp.take_along_axis(x, best, axis=1)[:, 0]

    end, end_slot, end_tok = take(s.fin_step), take(s.fin_slot), take(s.fin_tok)
    tokens, slots = _backtrack(s, end, end_slot, end_tok)
    lengths = _lengths(end, take(s.fin_score))
    weights = None
    if return_weights:
        batch_idx = jnp.arange(batch)
        flat = batch_idx[None, :] * k + slots  # [T, B]
        keep = (jnp.arange(steps)[:, None] < lengths[None, :])[:, :, None, None, None]

        def gather(buf):  # [T, L, B*K, H, Tk] -> [L, B, H, T, Tk]
            rows_ = jnp.where(keep, buf[jnp.arange(steps)[:, None], :, flat], 0.0)  # [T, B, L, H, Tk]
            return jnp.transpose(rows_, (2, 1, 3, 0, 4))

        weights = {"encoder_self": enc_w, "decoder_self": gather(s.w_self),
                   "cross": gather(s.w_cross)}
    return SearchOutput(tokens.T.astype(jnp.int32), lengths.astype(jnp.int32),
                        take(s.fin_lp), take(s.fin_score), weights)


def _lengths(end, score):
    """int32 lengths of store entries ending at step `end`: 0 for an entry never filled
    (score -inf: a filler row's, or one of more entries than there were hypotheses), as
    greedy search gives a filler row."""
    return jnp.where(jnp.isfinite(score), end + 1, 0).astype(jnp.int32)


def _backtrack(s: BeamState, end, end_slot, end_tok):
    """One store entry per sentence, followed back through the beams' back-pointers.

    end, end_slot, end_tok: int32 [B], the entry's `fin_step`, `fin_slot` and `fin_tok`.
    Returns (tokens [T, B], pad after the entry's last token; slots [T, B], the live slot
    that fed each step).
    """
    steps, batch = s.tok_hist.shape[0], s.tok_hist.shape[1]
    batch_idx = jnp.arange(batch)

    def step(next_slot, t):
        """next_slot: slot at step t + 1 of the entry -> slot at step t."""
        before = t < end
        token = jnp.where(t == end, end_tok,
                          jnp.where(before, s.tok_hist[t, batch_idx, next_slot], PAD_ID))
        slot = jnp.where(before, s.par_hist[t, batch_idx, next_slot], end_slot)
        return slot, (token, slot)

    _, out = jax.lax.scan(step, end_slot, jnp.arange(steps), reverse=True)
    return out
