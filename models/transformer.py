"""Encoder-decoder Transformer (Vaswani et al. 2017) built from the `attention/` modules.

Token conventions (`data/tokenizer.py`): pad = 0; the source is `tokens + [eos]`;
the decoder input is `[bos] + tokens`, the decoder target `tokens + [eos]`.

Entry points:
  * `model(src, tgt_in)` -> logits, the teacher-forced training pass; with the
    `*_segments` / `*_positions` of data/packing.py it runs on packed rows, each
    pair attending only within itself;
  * `encode` / `decode` for the two halves;
  * `init_decode_state` + `decode_step` for cached token-by-token decoding (search.py).
With `return_weights=True` each entry point also returns the attention weights keyed
by kind, stacked over layers: "encoder_self" [L_enc, B, H, S, S], "decoder_self"
[L_dec, B, H, T, T], "cross" [L_dec, B, H, T, S].

Head masks: every entry point takes `head_mask`, a dict keyed by the same kinds (a kind
may be missing) of float arrays [L, H] (one mask for the batch) or [L, B, H] (one per
row, e.g. several masks of one sentence batched together); 1 keeps a head, 0 removes it
(its output is multiplied by the mask before the output projection, as in Michel et al.
2019). None, the default, costs nothing.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from flax import nnx

from alignment.head import AlignmentHead, head_log_likelihood
from alignment.student import AlignmentStudent, log_posteriors
from attention import CrossKV, KVCache, segment_mask
from attention.dropout import dropout
from configs.model import ModelConfig
from data.tokenizer import EOS_ID, PAD_ID
from models.layers import DecoderLayer, Embeddings, EncoderLayer, layer_norm, split_rng


class DecodeState(NamedTuple):
    """Everything incremental decoding carries between steps (a pytree).

    caches: one `KVCache` per decoder layer (keys [B, H, T_max, Dk], values [B, H, T_max, Dv]);
    cross: one `CrossKV` per decoder layer (computed once per source; attention/cache.py).
    """

    caches: tuple[KVCache, ...]
    cross: tuple[CrossKV, ...]


def _stack(weights: list) -> jnp.ndarray | None:
    return None if weights[0] is None else jnp.stack(weights)


def layer_head_masks(head_mask: dict | None, kind: str, num_layers: int) -> list:
    """The per-layer masks ([H] or [B, H]) of `kind` in `head_mask`, or Nones."""
    masks = None if head_mask is None else head_mask.get(kind)
    return [None] * num_layers if masks is None else [masks[i] for i in range(num_layers)]


class Transformer(nnx.Module):
    """Encoder-decoder Transformer.

    Args:
      config: the typed model config (vocabulary sizes included), configs/model.py.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.dropout_rate = config.dropout
        self.dtype = jnp.dtype(config.dtype)
        self.target_embed = Embeddings(config.tgt_vocab_size, config, rngs=rngs)
        if config.share_embeddings:  # ModelConfig checked that the vocabularies are one
            self.source_embed = self.target_embed
        else:
            self.source_embed = Embeddings(config.src_vocab_size, config, rngs=rngs)
        self.encoder_layers = nnx.List(
            [EncoderLayer(config, rngs=rngs) for _ in range(config.num_encoder_layers)]
        )
        self.decoder_layers = nnx.List(
            [DecoderLayer(config, rngs=rngs) for _ in range(config.num_decoder_layers)]
        )
        # Pre-LN stacks need a final norm; post-LN layers already end in one.
        self.encoder_norm = layer_norm(config, rngs) if config.pre_ln else None
        self.decoder_norm = layer_norm(config, rngs) if config.pre_ln else None
        # The word-alignment mixture (alignment/head.py), trained beside translation.
        self.alignment_head = AlignmentHead(config, rngs=rngs) if config.alignment_head else None
        # ... and its twin of the other direction (target -> source), model.alignment_reverse.
        self.alignment_reverse = (AlignmentHead(config, rngs=rngs, reverse=True)
                                  if config.alignment_reverse else None)
        # ... and the context-aware layer the two teach (alignment/student.py).
        self.alignment_student = (AlignmentStudent(config, rngs=rngs)
                                  if config.alignment_student else None)

    def encode(self, src: jnp.ndarray, *, segments=None, positions=None, dropout_rng=None,
               return_weights: bool = False, head_mask: dict | None = None):
        """Encode source ids.

        src: int32 [B, S] (pad = 0); segments, positions: int32 [B, S] of packed rows
        (data/packing.py) or None. Returns (memory [B, S, D], src_valid bool [B, S],
        encoder self-attention [L_enc, B, H, S, S] | None).
        """
        valid = src != PAD_ID
        mask = None if segments is None else segment_mask(segments, segments)
        positions = jnp.arange(src.shape[1]) if positions is None else positions
        r = split_rng(dropout_rng, len(self.encoder_layers) + 1)
        x = dropout(self.source_embed(src, positions), self.dropout_rate, r[-1])
        weights = []
        masks = layer_head_masks(head_mask, "encoder_self", len(self.encoder_layers))
        for layer, rng, head in zip(self.encoder_layers, r, masks, strict=False):
            x, w = layer(x, valid, rng, return_weights, mask=mask, head_mask=head)
            weights.append(w)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, valid, _stack(weights)

    def cross_kv(self, memory: jnp.ndarray, src_valid: jnp.ndarray) -> tuple[CrossKV, ...]:
        """Project the encoder memory for every decoder layer once. memory: [B, S, D]."""
        return tuple(layer.cross_attention.precompute(memory, src_valid)
                     for layer in self.decoder_layers)

    def decode(self, tgt_in, memory, src_valid, *, segments=None, positions=None,
               src_segments=None, dropout_rng=None, return_weights=False, head_mask=None):
        """Teacher-forced decoder pass.

        tgt_in: int32 [B, T] (bos + tokens, pad = 0); memory: [B, S, D]; src_valid: bool [B, S];
        segments, positions: int32 [B, T] and src_segments int32 [B, S] of packed rows, or None.
        Returns (logits float32 [B, T, V], {"decoder_self": [L, B, H, T, T], "cross": [L, B, H, T, S]} | None).
        """
        states, weights = self.decoder_states(
            tgt_in, memory, src_valid, segments=segments, positions=positions,
            src_segments=src_segments, dropout_rng=dropout_rng, return_weights=return_weights,
            head_mask=head_mask)
        return self.target_embed.logits(states), weights

    def decoder_states(self, tgt_in, memory, src_valid, *, segments=None, positions=None,
                       src_segments=None, dropout_rng=None, return_weights=False,
                       head_mask=None):
        """`decode` up to the final (normed) decoder states [B, T, D], before the logits."""
        valid = tgt_in != PAD_ID
        self_mask = cross_mask = None
        if segments is not None:
            self_mask = segment_mask(segments, segments)
            cross_mask = segment_mask(segments, src_segments)
        positions = jnp.arange(tgt_in.shape[1]) if positions is None else positions
        r = split_rng(dropout_rng, len(self.decoder_layers) + 1)
        y = dropout(self.target_embed(tgt_in, positions), self.dropout_rate, r[-1])
        self_ws, cross_ws = [], []
        masks = self._decoder_head_masks(head_mask)
        for layer, kv, rng, heads in zip(self.decoder_layers, self.cross_kv(memory, src_valid), r,
                                         masks, strict=False):
            y, self_w, cross_w = layer(y, valid, kv, rng, return_weights, self_mask, cross_mask,
                                       heads)
            self_ws.append(self_w)
            cross_ws.append(cross_w)
        if self.decoder_norm is not None:
            y = self.decoder_norm(y)
        weights = {"decoder_self": _stack(self_ws), "cross": _stack(cross_ws)} if return_weights else None
        return y, weights

    def _decoder_head_masks(self, head_mask: dict | None) -> list[tuple]:
        """Per decoder layer: (self-attention mask, cross-attention mask)."""
        n = len(self.decoder_layers)
        return list(zip(layer_head_masks(head_mask, "decoder_self", n),
                        layer_head_masks(head_mask, "cross", n), strict=True))

    def __call__(self, src, tgt_in, *, src_segments=None, tgt_segments=None, src_positions=None,
                 tgt_positions=None, dropout_rng=None, return_weights=False, head_mask=None):
        """Training / teacher-forced forward pass.

        src: int32 [B, S]; tgt_in: int32 [B, T]; for packed rows (data/packing.py) also
        src_segments, src_positions int32 [B, S] and tgt_segments, tgt_positions int32
        [B, T]. Returns (logits float32 [B, T, V], weights dict {"encoder_self",
        "decoder_self", "cross"} | None).
        """
        enc_rng, dec_rng = split_rng(dropout_rng, 2)
        memory, src_valid, enc_w = self.encode(src, segments=src_segments, positions=src_positions,
                                               dropout_rng=enc_rng, return_weights=return_weights,
                                               head_mask=head_mask)
        logits, weights = self.decode(
            tgt_in, memory, src_valid, segments=tgt_segments, positions=tgt_positions,
            src_segments=src_segments, dropout_rng=dec_rng, return_weights=return_weights,
            head_mask=head_mask,
        )
        if return_weights:
            weights = {"encoder_self": enc_w, **weights}
        return logits, weights

    def forward_with_alignment(self, src, tgt_in, tgt_out, *, src_segments=None,
                               tgt_segments=None, src_positions=None, tgt_positions=None,
                               dropout_rng=None, return_weights: bool = False,
                               prior_weight: float | jnp.ndarray = 1.0):
        """The training pass plus the alignment head's likelihood (needs alignment_head).

        src: int32 [B, S]; tgt_in, tgt_out: int32 [B, T] (decoder input and the pieces its
        rows predict); packing arguments as in `__call__`; prior_weight as in
        `alignment.head.head_log_likelihood` (1: the model's own). Returns (logits float32
        [B, T, V], the head's log p(y_j | x, y_<j) float32 [B, T] (alignment/head.py;
        rows past a target's end are to be weighted 0), with model.alignment_reverse the
        reverse head's log p(x_i | y, x_<i) float32 [B, S] (rows past a source's end to be
        weighted 0; else None), the weights of `__call__` with return_weights (else none)
        plus the head's terms -- "alignment_log_prior" log a(i | x, y_<j) and
        "alignment_log_lexical" log t(y_j | x_i), float32 [B, T, S] (NEG_INF where masked;
        kept in logs, so a posterior that weights the prior differently is read without
        underflow), with model.alignment_jumps "alignment_transition_bias" [B, S + 1, S]
        (`AlignmentHead.transition_bias`), and the reverse head's the same with
        "alignment_reverse_" names, rows and columns swapped ([B, S, T] and [B, T + 1, T];
        the target's `</s>` its NULL word), and with model.alignment_student
        "alignment_student_log_posterior" [B, T, S] and
        "alignment_student_reverse_log_posterior" [B, S, T], its scores read both ways
        (alignment/student.py)).
        """
        enc_rng, dec_rng = split_rng(dropout_rng, 2)
        memory, src_valid, enc_w = self.encode(src, segments=src_segments,
                                               positions=src_positions, dropout_rng=enc_rng,
                                               return_weights=return_weights)
        states, weights = self.decoder_states(tgt_in, memory, src_valid, segments=tgt_segments,
                                              positions=tgt_positions, src_segments=src_segments,
                                              dropout_rng=dec_rng, return_weights=return_weights)
        if src_segments is None:
            mask = jnp.broadcast_to(src_valid[:, None, :], (*tgt_in.shape, src.shape[1]))
        else:
            mask = segment_mask(tgt_segments, src_segments)[:, 0]
        rows = self.source_embed.tokens.embedding[...][src] * self.source_embed.d_model**0.5
        head = self.alignment_head
        log_prior, log_lexical = head.log_terms(states, memory, rows, tgt_out, mask)
        bias = head.transition_bias(src == EOS_ID)  # None for the mixture
        log_likelihood = head_log_likelihood(log_prior, log_lexical, mask, bias, prior_weight)
        terms = {"alignment_log_prior": log_prior, "alignment_log_lexical": log_lexical,
                 **({} if bias is None else {"alignment_transition_bias": bias})}
        reverse_log_likelihood = None
        target_rows = (self.target_embed.tokens.embedding[...][tgt_out]
                       * self.target_embed.d_model**0.5)
        if self.alignment_reverse is not None:  # the same, target -> source
            reverse = self.alignment_reverse
            reverse_mask = jnp.broadcast_to((tgt_out != PAD_ID)[:, None, :],
                                            (*src.shape, tgt_out.shape[1]))
            r_prior, r_lexical = reverse.log_terms(None, None, target_rows, src, reverse_mask)
            r_bias = reverse.transition_bias(tgt_out == EOS_ID)
            reverse_log_likelihood = head_log_likelihood(r_prior, r_lexical, reverse_mask,
                                                          r_bias, prior_weight)
            terms.update(alignment_reverse_log_prior=r_prior,
                         alignment_reverse_log_lexical=r_lexical,
                         alignment_reverse_transition_bias=r_bias)
        if self.alignment_student is not None:  # its scores read both ways
            scores = self.alignment_student(states, target_rows, memory, rows, log_lexical,
                                            terms["alignment_reverse_log_lexical"], src_valid,
                                            tgt_out != PAD_ID)
            forward, backward = log_posteriors(scores, src_valid, tgt_out != PAD_ID)
            terms.update(alignment_student_log_posterior=forward,
                         alignment_student_reverse_log_posterior=backward)
        weights = {"encoder_self": enc_w, **weights, **terms} if return_weights else terms
        return self.target_embed.logits(states), log_likelihood, reverse_log_likelihood, weights

    def init_decode_state(self, memory, src_valid, max_length: int) -> DecodeState:
        """Empty self-attention caches for `max_length` steps and the projected memory.

        memory: [B, S, D]; src_valid: bool [B, S].
        """
        batch = memory.shape[0]
        caches = tuple(layer.self_attention.init_cache(batch, max_length)
                       for layer in self.decoder_layers)
        return DecodeState(caches, self.cross_kv(memory, src_valid))

    def decode_step(self, tokens: jnp.ndarray, state: DecodeState, *, return_weights: bool = False,
                    head_mask: dict | None = None):
        """Feed one token per sequence at position `state.caches[0].index`.

        tokens: int32 [B]; head_mask: as in the module docstring, over these B rows. Returns (logits float32 [B, V], new state,
        {"decoder_self": [L, B, H, T_max], "cross": [L, B, H, S]} | None).
        """
        position = state.caches[0].index
        y = self.target_embed(tokens[:, None], position[None])
        caches, self_ws, cross_ws = [], [], []
        for layer, cache, kv, heads in zip(self.decoder_layers, state.caches, state.cross,
                                           self._decoder_head_masks(head_mask), strict=True):
            y, cache, self_w, cross_w = layer.step(y, cache, kv, return_weights, heads)
            caches.append(cache)
            self_ws.append(None if self_w is None else self_w[:, :, 0])
            cross_ws.append(None if cross_w is None else cross_w[:, :, 0])
        if self.decoder_norm is not None:
            y = self.decoder_norm(y)
        logits = self.target_embed.logits(y)[:, 0]
        weights = {"decoder_self": _stack(self_ws), "cross": _stack(cross_ws)} if return_weights else None
        return logits, DecodeState(tuple(caches), state.cross), weights

