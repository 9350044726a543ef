"""Greedy and beam search over the cached decoder, with the attention maps of the result.

Both searches are one `jax.lax.while_loop` over `Transformer.decode_step`, batched,
with an early exit once every sentence is finished. They are pure functions of the
model and the source ids, so they trace inside `jax.jit`; `translate` is the jitted
entry point.

Conventions (the same as `data/tokenizer.py`): pad = 0, unk = 1, bos = 2, eos = 3.
Decoding starts from [bos]; pad and bos are never generated (their log-probability
is set to -inf after the log-softmax, so the scores stay the model's own log-probs).

Output (`SearchOutput`), with T_out = `max_length`:
  tokens     int32 [B, T_out]   the hypothesis without bos, ending in eos, then pad (0).
                                 A hypothesis cut at `max_length` has no eos.
  lengths    int32 [B]          number of tokens, eos included.
  log_probs  float32 [B]        sum of the model's log-probabilities of those tokens.
  scores     float32 [B]        beam search: log_probs / gnmt_penalty(lengths, alpha)
                                 (GNMT, Wu et al. 2016: ((5 + len) / 6) ** alpha);
                                 `greedy_search`: log_probs.
  weights    dict | None        with `return_weights=True`:
      "encoder_self" [L_enc, B, H, S, S]
      "decoder_self" [L_dec, B, H, T_out, T_out]
      "cross"        [L_dec, B, H, T_out, S]
    Row t is the decoding step that fed decoder-input token t of [bos] + hypothesis,
    i.e. exactly the rows teacher forcing `[bos] + hypothesis` produces; rows at or
    beyond `lengths` are 0. Under beam search these are the maps of the returned
    hypothesis (its rows are recovered through the beam back-pointers).

`max_length` is static (it fixes the cache and output shapes): compute it with
`max_target_length` and bucket it (`multiple=`), so that jit compiles few shapes.

Beam search (cf. the Flax WMT example and GNMT, with fairseq/Hugging Face admission):
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

jit pattern: `translate(model, src, ...)` splits the model (`nnx.split`) and calls one
`jax.jit`-compiled function of (graphdef [static], state, src, length_penalty [traced])
that merges the model inside the trace. Plain `jax.jit` over the split state has the
smallest per-call overhead on CPU (no NNX graph traversal inside the call, unlike
`nnx.jit`), and the length penalty is traced, so changing it does not recompile. One
compilation per (graph, src shape, beam_size, max_length, return_weights); callers that
already hold the split model use `translate_split`.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention.cache import reorder_batch
from models.transformer import DecodeState

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
NEVER_GENERATED = (PAD_ID, BOS_ID)
_NEG_INF = -jnp.inf


class SearchOutput(NamedTuple):
    """Result of a search (a pytree); see the module docstring for the shapes."""

    tokens: jnp.ndarray
    lengths: jnp.ndarray
    log_probs: jnp.ndarray
    scores: jnp.ndarray
    weights: dict | None


def gnmt_penalty(length, alpha):
    """GNMT length penalty ((5 + length) / 6) ** alpha (length counts the eos)."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** jnp.asarray(alpha, jnp.float32)


def max_target_length(src_lengths, *, ratio: float = 1.5, extra: int = 10, multiple: int = 1) -> int:
    """Decoding budget ceil(ratio * max source length + extra), rounded up to `multiple`.

    src_lengths: an int or a sequence/array of source lengths (eos included, pad excluded).
    The result is a Python int meant to be passed as the static `max_length`; round it
    to a bucket (`multiple=8`, say) so that jit compiles only a few shapes.
    """
    longest = int(np.max(np.asarray(src_lengths))) if np.size(src_lengths) else 0
    length = math.ceil(ratio * longest + extra)
    return max(1, -(-length // multiple) * multiple)


def _log_probs(logits: jnp.ndarray) -> jnp.ndarray:
    """float32 log-softmax over the vocabulary with pad and bos forbidden (-inf)."""
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return lp.at[..., jnp.array(NEVER_GENERATED)].set(_NEG_INF)


def _write_row(buf: jnp.ndarray, row: jnp.ndarray, t, axis: int) -> jnp.ndarray:
    """buf[..., t, ...] = row, with `row` lacking the axis `axis` (an in-place update)."""
    start = [0] * buf.ndim
    start[axis] = t
    return jax.lax.dynamic_update_slice(buf, jnp.expand_dims(row, axis).astype(buf.dtype), start)


def _check_max_length(max_length) -> int:
    if int(max_length) < 1:
        raise ValueError(f"max_length must be a static int >= 1, got {max_length}")
    return int(max_length)


def _decoder_dims(state: DecodeState) -> tuple[int, int]:
    """(number of decoder layers, number of heads) from the decode state."""
    return len(state.caches), state.caches[0].key.shape[1]


def greedy_search(model, src, *, max_length: int, return_weights: bool = False) -> SearchOutput:
    """Greedy (argmax) decoding.

    Args:
      model: a `Transformer` (or anything with `encode`, `init_decode_state`, `decode_step`).
      src: int32 [B, S] source ids (tokens + eos, pad = 0).
      max_length: static int, the most tokens generated per sentence (eos included).
      return_weights: also return the attention maps (a different compiled function).
    Returns:
      `SearchOutput`; `scores` equals `log_probs`.
    """
    src = jnp.asarray(src, jnp.int32)
    batch, src_len = src.shape
    steps = _check_max_length(max_length)
    memory, src_valid, enc_w = model.encode(src, return_weights=return_weights)
    state = model.init_decode_state(memory, src_valid, steps)
    num_layers, num_heads = _decoder_dims(state)

    carry = dict(
        t=jnp.zeros((), jnp.int32),
        last=jnp.full((batch,), BOS_ID, jnp.int32),
        tokens=jnp.zeros((batch, steps), jnp.int32),
        lengths=jnp.zeros((batch,), jnp.int32),
        log_probs=jnp.zeros((batch,), jnp.float32),
        finished=jnp.zeros((batch,), bool),
        state=state,
    )
    if return_weights:
        carry["w_self"] = jnp.zeros((num_layers, batch, num_heads, steps, steps), jnp.float32)
        carry["w_cross"] = jnp.zeros((num_layers, batch, num_heads, steps, src_len), jnp.float32)

    def cond(c):
        return (c["t"] < steps) & ~jnp.all(c["finished"])

    def body(c):
        t, finished = c["t"], c["finished"]
        logits, state, w = model.decode_step(c["last"], c["state"], return_weights=return_weights)
        lp = _log_probs(logits)
        token = jnp.argmax(lp, axis=-1).astype(jnp.int32)
        token_lp = jnp.take_along_axis(lp, token[:, None], axis=-1)[:, 0]
        token = jnp.where(finished, PAD_ID, token)
        new = dict(
            t=t + 1,
            last=token,
            tokens=_write_row(c["tokens"], token, t, axis=1),
            lengths=jnp.where(finished, c["lengths"], t + 1),
            log_probs=c["log_probs"] + jnp.where(finished, 0.0, token_lp),
            finished=finished | (token == EOS_ID),
            state=state,
        )
        if return_weights:
            new["w_self"] = _write_row(c["w_self"], w["decoder_self"], t, axis=3)
            new["w_cross"] = _write_row(c["w_cross"], w["cross"], t, axis=3)
        return new

    c = jax.lax.while_loop(cond, body, carry)
    weights = None
    if return_weights:
        rows = (jnp.arange(steps)[None, :] < c["lengths"][:, None])[None, :, None, :, None]
        weights = {
            "encoder_self": enc_w,
            "decoder_self": jnp.where(rows, c["w_self"], 0.0),
            "cross": jnp.where(rows, c["w_cross"], 0.0),
        }
    return SearchOutput(c["tokens"], c["lengths"], c["log_probs"], c["log_probs"], weights)


def beam_search(
    model,
    src,
    *,
    beam_size: int,
    length_penalty: float = 0.6,
    max_length: int,
    return_weights: bool = False,
) -> SearchOutput:
    """Beam search with GNMT length normalization (see the module docstring).

    Args:
      model: a `Transformer`.
      src: int32 [B, S] source ids.
      beam_size: static int >= 1; 1 runs `greedy_search`.
      length_penalty: alpha of ((5 + len) / 6) ** alpha; may be a traced scalar.
      max_length: static int, the most tokens per hypothesis (eos included).
      return_weights: also return the attention maps of the returned hypotheses.
    Returns:
      `SearchOutput` of the best hypothesis per sentence.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if beam_size == 1:
        out = greedy_search(model, src, max_length=max_length, return_weights=return_weights)
        return out._replace(scores=out.log_probs / gnmt_penalty(out.lengths, length_penalty))
    return _beam_search(model, src, beam_size=beam_size, alpha=length_penalty,
                        max_length=max_length, return_weights=return_weights)


def _beam_search(model, src, *, beam_size, alpha, max_length, return_weights, early_exit=True):
    """The beam search loop for any beam_size >= 1.

    With beam_size=1 it equals greedy search when alpha = 0; with alpha != 0 it may keep
    searching after greedy would stop (a live beam can still beat the finished one),
    which is why `beam_search` routes beam_size=1 to `greedy_search`. `early_exit=False`
    (tests only; a bool or a traced bool) ignores the bound and searches until max_length.
    """
    src = jnp.asarray(src, jnp.int32)
    batch, src_len = src.shape
    k, steps = int(beam_size), _check_max_length(max_length)
    alpha = jnp.asarray(alpha, jnp.float32)
    memory, src_valid, enc_w = model.encode(src, return_weights=return_weights)
    state = model.init_decode_state(memory, src_valid, steps)  # cross K/V projected once per sentence
    state = jax.tree.map(lambda x: x if x.ndim == 0 else jnp.repeat(x, k, axis=0), state)
    num_layers, num_heads = _decoder_dims(state)
    rows = jnp.arange(batch)[:, None]
    max_len_penalty = gnmt_penalty(steps, alpha)

    carry = dict(
        t=jnp.zeros((), jnp.int32),
        last=jnp.full((batch * k,), BOS_ID, jnp.int32),
        live_lp=jnp.full((batch, k), _NEG_INF, jnp.float32).at[:, 0].set(0.0),
        state=state,
        # back-pointers: token chosen at step t for live slot j, and its parent slot at step t
        tok_hist=jnp.zeros((steps, batch, k), jnp.int32),
        par_hist=jnp.zeros((steps, batch, k), jnp.int32),
        # finished store: score, log-prob, step of the last token, slot fed at that step, last token
        fin_score=jnp.full((batch, k), _NEG_INF, jnp.float32),
        fin_lp=jnp.full((batch, k), _NEG_INF, jnp.float32),
        fin_step=jnp.zeros((batch, k), jnp.int32),
        fin_slot=jnp.zeros((batch, k), jnp.int32),
        fin_tok=jnp.zeros((batch, k), jnp.int32),
        done=jnp.zeros((batch,), bool),
    )
    if return_weights:
        # weights of step t, indexed by the slot fed at step t: [T, L, B*K, H, Tk]
        carry["w_self"] = jnp.zeros((steps, num_layers, batch * k, num_heads, steps), jnp.float32)
        carry["w_cross"] = jnp.zeros((steps, num_layers, batch * k, num_heads, src_len), jnp.float32)

    def cond(c):
        return (c["t"] < steps) & ~jnp.all(c["done"])

    def body(c):
        t, done = c["t"], c["done"]
        logits, state, w = model.decode_step(c["last"], c["state"], return_weights=return_weights)
        lp = _log_probs(logits)
        vocab = lp.shape[-1]
        cand = (c["live_lp"][:, :, None] + lp.reshape(batch, k, vocab)).reshape(batch, k * vocab)
        # >= k of the best 2k do not end in eos. (The barrier keeps XLA from folding the
        # slices below into the sort, which defeats its TopK rewrite: a full sort of
        # k * V per step otherwise, ~100x slower on CPU.)
        top_lp, top_idx = jax.lax.optimization_barrier(jax.lax.top_k(cand, 2 * k))
        top_tok, top_par = top_idx % vocab, top_idx // vocab
        is_eos = top_tok == EOS_ID

        # new live beams: the best k extensions that do not end in eos
        live_lp, pick = jax.lax.top_k(jnp.where(is_eos, _NEG_INF, top_lp), k)
        live_tok = jnp.take_along_axis(top_tok, pick, axis=1)
        live_par = jnp.take_along_axis(top_par, pick, axis=1)

        # candidates for the finished store: eos extensions ranked within the best k,
        # and at the last step the live beams themselves (unfinished)
        open_ = ~done[:, None]
        eos_score = jnp.where(is_eos[:, :k] & open_, top_lp[:, :k] / gnmt_penalty(t + 1, alpha), _NEG_INF)
        unf_score = jnp.where((t == steps - 1) & open_, live_lp / max_len_penalty, _NEG_INF)
        step = jnp.full((batch, k), t, jnp.int32)
        score, pick = jax.lax.top_k(  # ties keep the earlier (already stored) entry
            jnp.concatenate([c["fin_score"], eos_score, unf_score], axis=1), k)

        def merge(old, eos_val, unf_val):
            return jnp.take_along_axis(jnp.concatenate([old, eos_val, unf_val], axis=1), pick, axis=1)

        fin_lp = merge(c["fin_lp"], top_lp[:, :k], live_lp)
        fin_step = merge(c["fin_step"], step, step)
        fin_slot = merge(c["fin_slot"], top_par[:, :k], live_par)
        fin_tok = merge(c["fin_tok"], top_tok[:, :k], live_tok)

        # done: the store is full and no live beam can beat its worst entry
        next_len = jnp.minimum(t + 2, steps)
        best_reachable = jnp.max(live_lp, axis=1) / jnp.maximum(gnmt_penalty(next_len, alpha),
                                                                max_len_penalty)
        done = done | (jnp.asarray(early_exit) & (jnp.min(score, axis=1) >= best_reachable))

        flat_parent = (rows * k + live_par).reshape(-1)
        new = dict(
            t=t + 1,
            last=live_tok.reshape(-1),
            live_lp=live_lp,
            state=DecodeState(reorder_batch(state.caches, flat_parent), state.cross),
            tok_hist=_write_row(c["tok_hist"], live_tok, t, axis=0),
            par_hist=_write_row(c["par_hist"], live_par, t, axis=0),
            fin_score=score, fin_lp=fin_lp, fin_step=fin_step, fin_slot=fin_slot, fin_tok=fin_tok,
            done=done,
        )
        if return_weights:
            new["w_self"] = _write_row(c["w_self"], w["decoder_self"], t, axis=0)
            new["w_cross"] = _write_row(c["w_cross"], w["cross"], t, axis=0)
        return new

    c = jax.lax.while_loop(cond, body, carry)

    best = jnp.argmax(c["fin_score"], axis=1)[:, None]

    def take(x):
        return jnp.take_along_axis(x, best, axis=1)[:, 0]

    end, end_slot, end_tok = take(c["fin_step"]), take(c["fin_slot"]), take(c["fin_tok"])
    batch_idx = jnp.arange(batch)

    def backtrack(next_slot, t):
        """next_slot: slot at step t + 1 of the returned hypothesis -> slot at step t."""
        before = t < end
        token = jnp.where(t == end, end_tok,
                          jnp.where(before, c["tok_hist"][t, batch_idx, next_slot], PAD_ID))
        slot = jnp.where(before, c["par_hist"][t, batch_idx, next_slot], end_slot)
        return slot, (token, slot)

    _, (tokens, slots) = jax.lax.scan(backtrack, end_slot, jnp.arange(steps), reverse=True)
    lengths = end + 1
    weights = None
    if return_weights:
        flat = batch_idx[None, :] * k + slots  # [T, B]
        keep = (jnp.arange(steps)[:, None] < lengths[None, :])[:, :, None, None, None]

        def gather(buf):  # [T, L, B*K, H, Tk] -> [L, B, H, T, Tk]
            rows_ = jnp.where(keep, buf[jnp.arange(steps)[:, None], :, flat], 0.0)  # [T, B, L, H, Tk]
            return jnp.transpose(rows_, (2, 1, 3, 0, 4))

        weights = {"encoder_self": enc_w, "decoder_self": gather(c["w_self"]),
                   "cross": gather(c["w_cross"])}
    return SearchOutput(tokens.T.astype(jnp.int32), lengths.astype(jnp.int32),
                        take(c["fin_lp"]), take(c["fin_score"]), weights)


class _GraphKey:
    """A GraphDef as a jit static argument.

    A GraphDef is unhashable when a module keeps an unhashable static attribute (a
    ConfigDict, a list); then the hash falls back to the type and jit's cache tells
    graphs apart by GraphDef equality.
    """

    __slots__ = ("graphdef", "_hash")

    def __init__(self, graphdef):
        self.graphdef = graphdef
        try:
            self._hash = hash(graphdef)
        except TypeError:
            self._hash = hash(type(graphdef))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, _GraphKey) and self.graphdef == other.graphdef


@functools.partial(jax.jit, static_argnames=("graph", "beam_size", "max_length", "return_weights"))
def _translate_jit(graph, state, src, length_penalty, *, beam_size, max_length, return_weights):
    model = nnx.merge(graph.graphdef, state)
    return beam_search(model, src, beam_size=beam_size, length_penalty=length_penalty,
                       max_length=max_length, return_weights=return_weights)


def _static_max_length(src, max_length) -> int:
    if max_length is not None:
        return int(max_length)
    return max_target_length(np.sum(np.asarray(src) != PAD_ID, axis=1), multiple=8)


def translate_split(
    graphdef,
    state,
    src,
    *,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    max_length: int | None = None,
    return_weights: bool = False,
) -> SearchOutput:
    """`translate` for a model already split with `nnx.split` (graphdef, state)."""
    max_length = _static_max_length(src, max_length)
    return _translate_jit(
        _GraphKey(graphdef), state, jnp.asarray(src, jnp.int32),
        jnp.asarray(length_penalty, jnp.float32), beam_size=int(beam_size),
        max_length=max_length, return_weights=bool(return_weights),
    )


def translate(
    model,
    src,
    *,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    max_length: int | None = None,
    return_weights: bool = False,
) -> SearchOutput:
    """Jitted decoding: beam_size 1 -> greedy, otherwise beam search.

    src: int [B, S] (pad = 0). max_length: static int; None uses
    `max_target_length(source lengths, multiple=8)` (bucketed, so few shapes compile).
    Returns a `SearchOutput` (for beam_size 1, `scores` are the log-probs normalized
    with `length_penalty`, as beam search would).
    """
    graphdef, state = nnx.split(model)
    return translate_split(graphdef, state, src, beam_size=beam_size, length_penalty=length_penalty,
                           max_length=max_length, return_weights=return_weights)


def to_token_lists(output: SearchOutput) -> list[list[int]]:
    """Host-side: each hypothesis as a list of ids, cut before its eos (no pad)."""
    tokens, lengths = np.asarray(output.tokens), np.asarray(output.lengths)
    result = []
    for row, n in zip(tokens, lengths, strict=True):
        ids = row[:n].tolist()
        result.append(ids[:-1] if ids and ids[-1] == EOS_ID else ids)
    return result

