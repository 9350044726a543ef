"""Multi-head attention modules on Flax NNX.

`MultiHeadAttention` is the general layer (separate Q/K/V/output projections,
`d_v` may differ from `d_k`); `SelfAttention`, `CausalSelfAttention` and
`CrossAttention` are the three uses in an encoder-decoder Transformer.

Every call returns `(output, weights)`. `weights` is None unless the caller passed
`return_weights=True`: asking for them switches to the reference path, which
materialises `[B, H, Tq, Tk]`; otherwise the fused path runs and nothing extra is
computed. Dropout is active only when a `dropout_rng` key is passed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attention.cache import CrossKV, KVCache
from attention.core import cached_attention, dot_product_attention
from attention.masks import causal_mask, combine_masks, key_padding_mask

# What every attention call returns: (output [B, Tq, D_out], weights [B, H, Tq, Tk] or None).
Attended = tuple[jnp.ndarray, jnp.ndarray | None]

# nnx.Linear's own default kernel initializer.
LECUN_NORMAL = nnx.initializers.lecun_normal()


class MultiHeadAttention(nnx.Module):
    """Multi-head attention with separate query, key, value and output projections.

    Args:
      in_features: width D_q of the query input.
      num_heads: H.
      qkv_features: total width of queries/keys, H * Dk (default D_q); divisible by H.
      value_features: total width of values, H * Dv (default qkv_features); divisible by H.
      out_features: output width (default D_q).
      kv_in_features: width of the key/value input (default D_q; the encoder width for cross-attention).
      dropout_rate: attention dropout on the weights.
      dtype: compute dtype; param_dtype: parameter dtype. Softmax is always float32.
      attention_impl: "auto" | "xla" | "cudnn" | "reference" (see `attention.core`).
      qkv_init, out_init: initializers of the query/key/value and output kernels (default
        Flax's `lecun_normal`, what nnx.Linear takes when given none); biases start at 0.
    """

    def __init__(
        self,
        in_features: int,
        num_heads: int,
        *,
        qkv_features: int | None = None,
        value_features: int | None = None,
        out_features: int | None = None,
        kv_in_features: int | None = None,
        dropout_rate: float = 0.0,
        use_bias: bool = True,
        dtype: jnp.dtype | None = None,
        param_dtype: jnp.dtype = jnp.float32,
        attention_impl: str = "auto",
        qkv_init: nnx.Initializer = LECUN_NORMAL,
        out_init: nnx.Initializer = LECUN_NORMAL,
        rngs: nnx.Rngs,
    ):
        qkv_features = qkv_features or in_features
        value_features = value_features or qkv_features
        out_features = out_features or in_features
        kv_in_features = kv_in_features or in_features
        for name, width in (("qkv_features", qkv_features), ("value_features", value_features)):
            if width % num_heads:
                raise ValueError(f"{name}={width} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.key_dim = qkv_features // num_heads
        self.value_dim = value_features // num_heads
        self.dropout_rate = dropout_rate
        self.attention_impl = attention_impl
        self.dtype = dtype
        linear = dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.query = nnx.Linear(in_features, qkv_features, kernel_init=qkv_init, **linear)
        self.key = nnx.Linear(kv_in_features, qkv_features, kernel_init=qkv_init, **linear)
        self.value = nnx.Linear(kv_in_features, value_features, kernel_init=qkv_init, **linear)
        self.out = nnx.Linear(value_features, out_features, kernel_init=out_init, **linear)

    def _heads(self, x: jnp.ndarray, head_dim: int) -> jnp.ndarray:
        """[B, T, H * d] -> [B, T, H, d]."""
        return x.reshape(*x.shape[:-1], self.num_heads, head_dim)

    def project_query(self, x: jnp.ndarray) -> jnp.ndarray:
        """x: [B, Tq, D_q] -> queries [B, Tq, H, Dk]."""
        return self._heads(self.query(x), self.key_dim)

    def project_kv(self, x: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        """x: [B, Tk, D_kv] -> (keys [B, Tk, H, Dk], values [B, Tk, H, Dv])."""
        return self._heads(self.key(x), self.key_dim), self._heads(self.value(x), self.value_dim)

    def attend(
        self,
        query: jnp.ndarray,
        key: jnp.ndarray,
        value: jnp.ndarray,
        mask: jnp.ndarray | None,
        dropout_rng: jax.Array | None,
        return_weights: bool,
        head_mask: jnp.ndarray | None = None,
    ) -> tuple[jnp.ndarray, jnp.ndarray | None]:
        """Attention over already projected heads, then the output projection.

        query: [B, Tq, H, Dk]; key: [B, Tk, H, Dk]; value: [B, Tk, H, Dv]; mask broadcastable
        to [B, H, Tq, Tk]; head_mask: see `combine_heads`. Returns (output
        [B, Tq, out_features], weights [B, H, Tq, Tk] | None).
        """
        mixed, weights = dot_product_attention(
            query, key, value, mask,
            dropout_rate=self.dropout_rate, dropout_rng=dropout_rng,
            return_weights=return_weights, implementation=self.attention_impl,
        )
        return self.combine_heads(mixed, head_mask), weights

    def combine_heads(self, mixed: jnp.ndarray, head_mask: jnp.ndarray | None) -> jnp.ndarray:
        """Each head's output [B, Tq, H, Dv], scaled by `head_mask`, through the output
        projection: [B, Tq, out_features].

        head_mask: float [H] (one mask for the batch) or [B, H] (one per row), 1 = keep,
        0 = remove the head (Michel et al. 2019's gate: its gradient is the head's
        importance); None costs nothing. The weights returned are not masked.
        """
        if head_mask is not None:
            mixed = mixed * jnp.asarray(head_mask, mixed.dtype)[..., None, :, None]
        return self.out(mixed.reshape(*mixed.shape[:2], self.num_heads * self.value_dim))

    def __call__(self, inputs_q: jnp.ndarray, inputs_kv: jnp.ndarray | None = None,
                 *, mask: jnp.ndarray | None = None,
                 dropout_rng: jax.Array | None = None, return_weights: bool = False,
                 head_mask: jnp.ndarray | None = None) -> Attended:
        """General attention.

        Args:
          inputs_q: [B, Tq, D_q]; inputs_kv: [B, Tk, D_kv] (defaults to inputs_q).
          mask: bool broadcastable to [B, H, Tq, Tk]; True = may attend.
          head_mask: float [H] or [B, H], 0 removes a head (`combine_heads`).
        Returns:
          (output [B, Tq, out_features], weights float32 [B, H, Tq, Tk] | None).
        """
        inputs_kv = inputs_q if inputs_kv is None else inputs_kv
        key, value = self.project_kv(inputs_kv)
        return self.attend(self.project_query(inputs_q), key, value, mask, dropout_rng,
                           return_weights, head_mask)


class SelfAttention(MultiHeadAttention):
    """Bidirectional self-attention over one sequence with padding (the encoder's)."""

    def __call__(self, x: jnp.ndarray, valid: jnp.ndarray,
                 *, mask: jnp.ndarray | None = None,
                 dropout_rng: jax.Array | None = None, return_weights: bool = False,
                 head_mask: jnp.ndarray | None = None) -> Attended:
        """x: [B, T, D]; valid: bool [B, T]. Returns ([B, T, D], weights [B, H, T, T] | None).

        `mask` (bool broadcastable to [B, H, T, T], e.g. `segment_mask` of packed
        sequences) replaces the key-padding mask built from `valid`.
        """
        mask = key_padding_mask(valid) if mask is None else mask
        return super().__call__(x, mask=mask, dropout_rng=dropout_rng,
                                return_weights=return_weights, head_mask=head_mask)


class CausalSelfAttention(MultiHeadAttention):
    """Decoder self-attention: each position sees itself and earlier non-pad positions."""

    def __call__(self, x: jnp.ndarray, valid: jnp.ndarray,
                 *, mask: jnp.ndarray | None = None,
                 dropout_rng: jax.Array | None = None, return_weights: bool = False,
                 head_mask: jnp.ndarray | None = None) -> Attended:
        """x: [B, T, D]; valid: bool [B, T]. Returns ([B, T, D], weights [B, H, T, T] | None).

        `mask` (e.g. `segment_mask` of packed sequences) replaces the key-padding mask
        built from `valid`; the causal mask is always applied.
        """
        mask = combine_masks(causal_mask(x.shape[1]), key_padding_mask(valid) if mask is None else mask)
        return super().__call__(x, mask=mask, dropout_rng=dropout_rng,
                                return_weights=return_weights, head_mask=head_mask)

    def init_cache(self, batch: int, max_length: int, dtype: jnp.dtype | None = None) -> KVCache:
        """An empty `KVCache` for `max_length` decoding steps."""
        dtype = dtype or self.dtype or jnp.float32
        return KVCache.zeros(batch, max_length, self.num_heads, self.key_dim, self.value_dim, dtype)

    def step(self, x: jnp.ndarray, cache: KVCache, *, return_weights: bool = False,
             head_mask: jnp.ndarray | None = None,
             ) -> tuple[jnp.ndarray, KVCache, jnp.ndarray | None]:
        """Decode one token at position `cache.index` (no dropout: decoding is inference).

        Args:
          x: [B, 1, D], the new token's input.
          cache: keys/values of the earlier positions.
          head_mask: [H] or [B, H] (`combine_heads`).
        Returns:
          (output [B, 1, D], updated cache, weights [B, H, 1, T_max] | None; zero beyond the
          current position).
        """
        key, value = self.project_kv(x)
        cache = cache.append(key, value)
        mixed, weights = cached_attention(
            self.project_query(x), cache.key, cache.value, cache.valid_mask()
        )
        return self.combine_heads(mixed, head_mask), cache, (weights if return_weights else None)


class CrossAttention(MultiHeadAttention):
    """Decoder-to-encoder attention: queries from the decoder, keys/values from encoder memory."""

    def precompute(self, memory: jnp.ndarray, memory_valid: jnp.ndarray) -> CrossKV:
        """Project encoder memory once per source (reused at every decoding step).

        memory: [B, S, D_enc]; memory_valid: bool [B, S].
        """
        key, value = self.project_kv(memory)
        return CrossKV(key, value, memory_valid)

    def __call__(self, x: jnp.ndarray, memory: jnp.ndarray | CrossKV,
                 memory_valid: jnp.ndarray | None = None, *, mask: jnp.ndarray | None = None,
                 dropout_rng: jax.Array | None = None, return_weights: bool = False,
                 head_mask: jnp.ndarray | None = None) -> Attended:
        """Attend from decoder states to the source.

        Args:
          x: [B, T, D]; memory: encoder output [B, S, D_enc] with `memory_valid` bool [B, S],
            or a `CrossKV` from `precompute` (then `memory_valid` is taken from it).
          head_mask: float [H] or [B, H], 0 removes a head (`combine_heads`).
          mask: bool broadcastable to [B, H, T, S] replacing the key-padding mask of the
            memory (packed pairs: `segment_mask(target_segments, source_segments)`).
        Returns:
          (output [B, T, D], weights [B, H, T, S] | None).
        """
        kv = memory if isinstance(memory, CrossKV) else self.precompute(memory, memory_valid)
        mask = key_padding_mask(kv.valid) if mask is None else mask
        return self.attend(self.project_query(x), kv.key, kv.value, mask, dropout_rng,
                           return_weights, head_mask)
