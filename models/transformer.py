"""Encoder-decoder Transformer (Vaswani et al. 2017) built from the `attention/` modules.

Token conventions (`data/tokenizer.py`): pad = 0; the source is `tokens + [eos]`;
the decoder input is `[bos] + tokens`, the decoder target `tokens + [eos]`.

Entry points:
  * `model(src, tgt_in)` -> logits, the teacher-forced training pass; with the
    `*_segments` / `*_positions` of data/packing.py it runs on packed rows, each
    pair attending only within itself;
  * `features`, the same pass up to the decoder's final states (what a training
    plug-in's loss reads, training/plugins.py);
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

from attention import CrossKV, KVCache, segment_mask
from attention.dropout import dropout
from configs.model import ModelConfig
from data.tokenizer import PAD_ID
from models.layers import DecoderLayer, Embeddings, EncoderLayer, layer_norm, split_rng


class DecodeState(NamedTuple):
    """Everything incremental decoding carries between steps (a pytree).

    caches: one `KVCache` per decoder layer (keys [B, H, T_max, Dk], values [B, H, T_max, Dv]);
    cross: one `CrossKV` per decoder layer (computed once per source; attention/cache.py).
    """

    caches: tuple[KVCache, ...]
    cross: tuple[CrossKV, ...]


class Features(NamedTuple):
    """The teacher-forced pass before the output projection (`Transformer.features`).

    memory: the encoder's output [B, S, D]; src_valid: bool [B, S]; states: the final
    (normed) decoder states [B, T, D]; weights: as `__call__` returns them, or None.
    """

    memory: jnp.ndarray
    src_valid: jnp.ndarray
    states: jnp.ndarray
    weights: dict | None


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
        out = self.features(src, tgt_in, src_segments=src_segments, tgt_segments=tgt_segments,
                            src_positions=src_positions, tgt_positions=tgt_positions,
                            dropout_rng=dropout_rng, return_weights=return_weights,
                            head_mask=head_mask)
        return self.target_embed.logits(out.states), out.weights

    def features(self, src, tgt_in, *, src_segments=None, tgt_segments=None, src_positions=None,
                 tgt_positions=None, dropout_rng=None, return_weights=False,
                 head_mask=None) -> Features:
        """`__call__` up to the final decoder states, with the encoder's output beside them:
        what a plug-in's loss reads (training/plugins.py). Arguments as in `__call__`."""
        enc_rng, dec_rng = split_rng(dropout_rng, 2)
        memory, src_valid, enc_w = self.encode(src, segments=src_segments, positions=src_positions,
                                               dropout_rng=enc_rng, return_weights=return_weights,
                                               head_mask=head_mask)
        states, weights = self.decoder_states(
            tgt_in, memory, src_valid, segments=tgt_segments, positions=tgt_positions,
            src_segments=src_segments, dropout_rng=dec_rng, return_weights=return_weights,
            head_mask=head_mask,
        )
        if return_weights:
            weights = {"encoder_self": enc_w, **weights}
        return Features(memory, src_valid, states, weights)

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

