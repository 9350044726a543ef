"""Greedy search over the cached decoder, and what both searches share (beam search:
models/beam_search.py), with the attention maps of the result.

Both searches are one `jax.lax.while_loop` over `Transformer.decode_step`, batched,
with an early exit once every sentence is finished. They are pure functions of the
model and the source ids, so they trace inside `jax.jit`; the jitted entry points
(`translate`, `translate_split`) are in models/translate.py.

Token ids come from `data/tokenizer.py` (pad = 0, unk = 1, bos = 2, eos = 3).
Decoding starts from [bos]; pad and bos are never generated (their log-probability
is set to -inf after the log-softmax, so the scores stay the model's own log-probs).
An `Ensemble` (models/ensemble.py) returns its members' mean log-probs itself.

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
"""


from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from models.transformer import DecodeState

NEVER_GENERATED = (PAD_ID, BOS_ID)
NEG_INF = -jnp.inf


class SearchOutput(NamedTuple):
    """Result of a search (a pytree); see the module docstring for the shapes."""

    tokens: jnp.ndarray
    lengths: jnp.ndarray
    log_probs: jnp.ndarray
    scores: jnp.ndarray
    weights: dict | None


class _GreedyState(NamedTuple):
    """The greedy loop carry (a pytree); B sentences, T = max_length, L layers, H heads."""

    t: jnp.ndarray  # int32 []: the step, = tokens generated so far per unfinished sentence
    last: jnp.ndarray  # int32 [B]: the token fed at step t (bos first, pad once finished)
    tokens: jnp.ndarray  # int32 [B, T]: the output so far (pad after eos)
    lengths: jnp.ndarray  # int32 [B]: tokens generated, eos included
    log_probs: jnp.ndarray  # float32 [B]: their summed log-probability
    done: jnp.ndarray  # bool [B]: eos generated
    decode_state: DecodeState  # the decoder's caches, B rows
    w_self: jnp.ndarray | None  # float32 [L, B, H, T, T]: row t written at step t; or None
    w_cross: jnp.ndarray | None  # float32 [L, B, H, T, S]: likewise; None without weights


def max_target_length(src_lengths, *, ratio: float = 1.5, extra: int = 10, multiple: int = 1) -> int:
    """Decoding budget ceil(ratio * max source length + extra), rounded up to `multiple`.

    src_lengths: an int or a sequence/array of source lengths (eos included, pad excluded).
    The result is a Python int meant to be passed as the static `max_length`; round it
    to a bucket (`multiple=8`, say) so that jit compiles only a few shapes.
    """
    longest = int(np.max(np.asarray(src_lengths))) if np.size(src_lengths) else 0
    length = math.ceil(ratio * longest + extra)
    return max(1, -(-length // multiple) * multiple)


def _log_probs(logits: jnp.ndarray, normalized: bool = False) -> jnp.ndarray:
    """float32 log-softmax over the vocabulary (unless `normalized`), pad and bos -inf."""
    lp = logits if normalized else jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return lp.at[..., jnp.array(NEVER_GENERATED)].set(NEG_INF)


def write_row(buf: jnp.ndarray, row: jnp.ndarray, t, axis: int) -> jnp.ndarray:
    """buf[..., t, ...] = row, with `row` lacking the axis `axis` (an in-place update)."""
    start = [0] * buf.ndim
    start[axis] = t
    return jax.lax.dynamic_update_slice(buf, jnp.expand_dims(row, axis).astype(buf.dtype), start)


def check_max_length(max_length) -> int:
    """`max_length` as a Python int, or a ValueError: it sizes the decoding buffers, so it
    must be static and at least 1."""
    if int(max_length) < 1:
        raise ValueError(f"max_length must be a static int >= 1, got {max_length}")
    return int(max_length)


def decoder_dims(state) -> tuple[int, int]:
    """(decoder layers, heads) of the recorded model (an `EnsembleState`'s first member)."""
    state = getattr(state, "members", (state,))[0]
    return len(state.caches), state.caches[0].key.shape[1]


def weight_buffers(return_weights: bool, lead: tuple[int, ...], steps: int, src_len: int):
    """Zeroed float32 buffers for the decoder self- and cross-attention rows recorded while
    decoding: ([*lead, steps], [*lead, src_len]), or (None, None) without weights."""
    if not return_weights:
        return None, None
    return (jnp.zeros((*lead, steps), jnp.float32), jnp.zeros((*lead, src_len), jnp.float32))


def running(steps: int):
    """The while_loop condition of both searches: steps left and a sentence not done."""
    return lambda s: (s.t < steps) & ~jnp.all(s.done)


def next_log_probs(model, s, return_weights: bool, masked: dict):
    """One decoder step from search state `s`: (log-probs [rows, V], decode state, weights)."""
    logits, state, w = model.decode_step(s.last, s.decode_state, return_weights=return_weights,
                                         **masked)
    return _log_probs(logits, getattr(model, "returns_log_probs", False)), state, w


def greedy_search(model, src, *, max_length: int, return_weights: bool = False,
                  head_mask: dict | None = None) -> SearchOutput:
    """Greedy (argmax) decoding.

    Args:
      model: a `Transformer`, an `Ensemble`, or anything with `encode`,
        `init_decode_state` and `decode_step`.
      src: int32 [B, S] source ids (tokens + eos, pad = 0).
      max_length: static int, the most tokens generated per sentence (eos included).
      return_weights: also return the attention maps (a different compiled function).
      head_mask: {kind: [L, H] or [L, B, H]} heads to keep (1) or remove (0), or None
        (models/transformer.py).
    Returns:
      `SearchOutput`; `scores` equals `log_probs`.
    """
    src = jnp.asarray(src, jnp.int32)
    batch, src_len = src.shape
    steps = check_max_length(max_length)
    masked = {} if head_mask is None else {"head_mask": head_mask}  # only models that mask
    memory, src_valid, enc_w = model.encode(src, return_weights=return_weights, **masked)
    state = model.init_decode_state(memory, src_valid, steps)
    num_layers, num_heads = decoder_dims(state)
    w_self, w_cross = weight_buffers(return_weights, (num_layers, batch, num_heads, steps),
                                      steps, src_len)
    s = _GreedyState(
        t=jnp.zeros((), jnp.int32),
        last=jnp.full((batch,), BOS_ID, jnp.int32),
        tokens=jnp.zeros((batch, steps), jnp.int32),
        lengths=jnp.zeros((batch,), jnp.int32),
        log_probs=jnp.zeros((batch,), jnp.float32),
        done=~src_valid.any(axis=1),  # all-pad filler rows: nothing to decode
        decode_state=state,
        w_self=w_self,
        w_cross=w_cross,
    )

    def body(s: _GreedyState) -> _GreedyState:
        t, finished = s.t, s.done
        lp, state, w = next_log_probs(model, s, return_weights, masked)
        token = jnp.argmax(lp, axis=-1).astype(jnp.int32)
        token_lp = jnp.take_along_axis(lp, token[:, None], axis=-1)[:, 0]
        token = jnp.where(finished, PAD_ID, token)
        return _GreedyState(
            t=t + 1,
            last=token,
            tokens=write_row(s.tokens, token, t, axis=1),
            lengths=jnp.where(finished, s.lengths, t + 1),
            log_probs=s.log_probs + jnp.where(finished, 0.0, token_lp),
            done=finished | (token == EOS_ID),
            decode_state=state,
            w_self=write_row(s.w_self, w["decoder_self"], t, axis=3) if return_weights else None,
            w_cross=write_row(s.w_cross, w["cross"], t, axis=3) if return_weights else None,
        )

    s = jax.lax.while_loop(running(steps), body, s)
    weights = None
    if return_weights:
        rows = (jnp.arange(steps)[None, :] < s.lengths[:, None])[None, :, None, :, None]
        weights = {
            "encoder_self": enc_w,
            "decoder_self": jnp.where(rows, s.w_self, 0.0),
            "cross": jnp.where(rows, s.w_cross, 0.0),
        }
    return SearchOutput(s.tokens, s.lengths, s.log_probs, s.log_probs, weights)
