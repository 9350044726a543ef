"""Transformer building blocks: embeddings with positions, feed-forward, encoder and decoder layers.

All attention goes through the `attention/` modules. Dropout is active only when a
PRNG key is passed (`dropout_rng`); eval and decoding pass None.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention import CausalSelfAttention, CrossAttention, CrossKV, KVCache, SelfAttention
from attention.dropout import dropout
from attention.modules import LECUN_NORMAL
from configs.model import EMBEDDING_GRADS, ModelConfig

ACTIVATIONS = {"relu": jax.nn.relu, "gelu": jax.nn.gelu}


class KernelInits(NamedTuple):
    """Initializers of the query/key/value, attention-output and feed-forward kernels."""

    qkv: nnx.Initializer
    out: nnx.Initializer
    feed_forward: nnx.Initializer


# model.kernel_init -> KernelInits. fairseq's Transformer (the anchors' code) draws every
# weight matrix Xavier-uniform and the query/key/value ones at gain 1/sqrt(2) (variance scale
# 1/2): for a d -> d projection that is half lecun_normal's variance, so the first attention
# logits are more uniform. Biases start at zero in both (fairseq leaves its query/key/value
# biases at PyTorch's default, uniform within 1/sqrt(fan_in): not matched).
KERNEL_INITS = {
    "lecun_normal": KernelInits(LECUN_NORMAL, LECUN_NORMAL, LECUN_NORMAL),
    "xavier_uniform": KernelInits(nnx.initializers.variance_scaling(0.5, "fan_avg", "uniform"),
                                  nnx.initializers.xavier_uniform(),
                                  nnx.initializers.xavier_uniform()),
}


def split_rng(rng: jax.Array | None, num: int) -> list[jax.Array | None]:
    """`num` independent keys from `rng`, or `num` Nones when dropout is off."""
    return [None] * num if rng is None else list(jax.random.split(rng, num))


def sinusoidal_positions(positions: jnp.ndarray, dim: int) -> jnp.ndarray:
    """Sinusoidal position encodings (Vaswani et al. 2017), sin on even, cos on odd channels.

    positions: int [...]; returns float32 [..., dim].
    """
    inv_freq = np.exp(-math.log(10000.0) * np.arange(0, dim, 2) / dim).astype(np.float32)
    angles = positions[..., None].astype(jnp.float32) * inv_freq
    enc = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    return enc.reshape(*positions.shape, -1)[..., :dim]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def embedding_lookup(table: jnp.ndarray, ids: jnp.ndarray, dtype, grad: str = "auto"):
    """Rows of `table` [V, D] at `ids` int [...], cast to `dtype`: [..., D].

    The gradient for `table` (float32 accumulation, `table`'s dtype) is built as `grad`
    says: "scatter" adds each row's gradient into its table row (XLA scatter-add, what
    `jnp.take` differentiates to); "one_hot" multiplies one_hot(ids)^T [V, N] by the
    gradients [N, D] in `dtype` on the matrix units; "auto" takes "one_hot" on GPU/TPU and
    "scatter" on CPU: a GPU serialises the scatter's repeated ids, while the one-hot product
    (2 * N * V * D FLOPs and an N x V buffer in `dtype`, N tokens of the batch) runs on the
    matrix units; on a CPU the buffer costs more than the scatter (bench/README.md, GPU).
    """
    return jnp.take(table, ids, axis=0).astype(dtype)


def _lookup_fwd(table, ids, dtype, grad):
    return embedding_lookup(table, ids, dtype, grad), (table, ids)


def _lookup_bwd(dtype, grad, residuals, g):
    table, ids = residuals
    flat_ids, flat_g = ids.reshape(-1), g.reshape(-1, g.shape[-1])
    if grad not in EMBEDDING_GRADS:
        raise ValueError(f"model.embedding_grad must be one of {EMBEDDING_GRADS}, not {grad!r}")
    if grad == "auto":
        grad = "scatter" if jax.default_backend() == "cpu" else "one_hot"
    if grad == "one_hot":
        one_hot = jax.nn.one_hot(flat_ids, table.shape[0], dtype=flat_g.dtype)
        table_grad = jnp.einsum("nv,nd->vd", one_hot, flat_g, preferred_element_type=jnp.float32)
    else:
        table_grad = jnp.zeros(table.shape, jnp.float32).at[flat_ids].add(
            flat_g.astype(jnp.float32))
    return table_grad.astype(table.dtype), None


embedding_lookup.defvjp(_lookup_fwd, _lookup_bwd)


class Embeddings(nnx.Module):
    """Token embedding scaled by sqrt(d_model) plus sinusoidal or learned positions.

    The token table doubles as the output projection when embeddings are shared.
    """

    def __init__(self, vocab_size: int, config: ModelConfig, *, rngs: nnx.Rngs):
        self.d_model = config.d_model
        self.kind = config.positions
        self.dtype = jnp.dtype(config.dtype)
        self.grad = config.embedding_grad
        self.tokens = nnx.Embed(
            vocab_size, config.d_model, dtype=self.dtype,
            param_dtype=jnp.dtype(config.param_dtype),
            embedding_init=nnx.initializers.normal(config.d_model**-0.5), rngs=rngs,
        )
        if self.kind == "learned":
            self.positions = nnx.Embed(config.max_positions, config.d_model, dtype=self.dtype,
                                       rngs=rngs)

    def __call__(self, ids: jnp.ndarray, positions: jnp.ndarray) -> jnp.ndarray:
        """ids: int [B, T]; positions: int [B, T] or [T]. Returns [B, T, D]."""
        rows = embedding_lookup(self.tokens.embedding[...], ids, self.dtype, self.grad)
        x = rows * jnp.asarray(math.sqrt(self.d_model), self.dtype)
        if self.kind == "learned":
            pos = self.positions(positions)
        else:
            pos = sinusoidal_positions(positions, self.d_model)
        return x + pos.astype(self.dtype)

    def logits(self, x: jnp.ndarray) -> jnp.ndarray:
        """Tied output projection: x [B, T, D] -> float32 logits [B, T, V]."""
        table = self.tokens.embedding[...].astype(x.dtype)
        return jnp.einsum("btd,vd->btv", x, table, preferred_element_type=jnp.float32)


class FeedForward(nnx.Module):
    """Position-wise feed-forward: Linear(D -> d_ff), activation, dropout, Linear(d_ff -> D)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        kw = dict(dtype=jnp.dtype(config.dtype), param_dtype=jnp.dtype(config.param_dtype),
                  rngs=rngs)
        init = KERNEL_INITS[config.kernel_init].feed_forward
        self.up = nnx.Linear(config.d_model, config.d_ff, kernel_init=init, **kw)
        self.down = nnx.Linear(config.d_ff, config.d_model, kernel_init=init, **kw)
        self.activation = ACTIVATIONS[config.activation]
        self.rate = config.dropout

    def __call__(self, x: jnp.ndarray, dropout_rng: jax.Array | None) -> jnp.ndarray:
        """x: [B, T, D] -> [B, T, D]."""
        return self.down(dropout(self.activation(self.up(x)), self.rate, dropout_rng))


def _attention_kwargs(config: ModelConfig) -> dict:
    inits = KERNEL_INITS[config.kernel_init]
    return dict(
        dropout_rate=config.attention_dropout, dtype=jnp.dtype(config.dtype),
        param_dtype=jnp.dtype(config.param_dtype), attention_impl=config.attention_impl,
        qkv_init=inits.qkv, out_init=inits.out,
    )


def layer_norm(config: ModelConfig, rngs: nnx.Rngs) -> nnx.LayerNorm:
    """LayerNorm over d_model (epsilon 1e-6) in the config's dtypes."""
    return nnx.LayerNorm(config.d_model, epsilon=1e-6, dtype=jnp.dtype(config.dtype),
                         param_dtype=jnp.dtype(config.param_dtype), rngs=rngs)


class Residual(nnx.Module):
    """One residual sublayer with its layer norm: pre-LN `x + f(LN(x))` or post-LN `LN(x + f(x))`."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.norm = layer_norm(config, rngs)
        self.pre_ln = config.pre_ln
        self.rate = config.dropout

    def __call__(self, x, sublayer, dropout_rng):
        """x: [B, T, D]; sublayer maps [B, T, D] -> ([B, T, D], extra). Returns (y, extra)."""
        y, extra = sublayer(self.norm(x) if self.pre_ln else x)
        y = x + dropout(y, self.rate, dropout_rng)
        return (y if self.pre_ln else self.norm(y)), extra


class EncoderLayer(nnx.Module):
    """Self-attention + feed-forward, each in a residual block."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.attention = SelfAttention(config.d_model, config.num_heads,
                                       **_attention_kwargs(config), rngs=rngs)
        self.feed_forward = FeedForward(config, rngs=rngs)
        self.attention_block = Residual(config, rngs=rngs)
        self.feed_forward_block = Residual(config, rngs=rngs)

    def __call__(self, x, valid, dropout_rng=None, return_weights=False, mask=None,
                 head_mask=None):
        """x: [B, S, D]; valid: bool [B, S]; mask: optional attention mask replacing the
        padding mask (packed sequences); head_mask: [H] or [B, H] (0 removes a head).
        Returns ([B, S, D], weights [B, H, S, S] | None)."""
        r = split_rng(dropout_rng, 4)
        x, weights = self.attention_block(
            x, lambda h: self.attention(h, valid, mask=mask, dropout_rng=r[0],
                                        return_weights=return_weights, head_mask=head_mask),
            r[1],
        )
        x, _ = self.feed_forward_block(x, lambda h: (self.feed_forward(h, r[2]), None), r[3])
        return x, weights


class DecoderLayer(nnx.Module):
    """Causal self-attention, cross-attention to the encoder, feed-forward; each residual."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        kw = _attention_kwargs(config)
        self.self_attention = CausalSelfAttention(config.d_model, config.num_heads, **kw, rngs=rngs)
        self.cross_attention = CrossAttention(config.d_model, config.num_heads, **kw, rngs=rngs)
        self.feed_forward = FeedForward(config, rngs=rngs)
        self.self_block = Residual(config, rngs=rngs)
        self.cross_block = Residual(config, rngs=rngs)
        self.feed_forward_block = Residual(config, rngs=rngs)

    def __call__(self, y, valid, cross_kv: CrossKV, dropout_rng=None, return_weights=False,
                 self_mask=None, cross_mask=None, head_masks=(None, None)):
        """Full-sequence (teacher-forced) pass.

        y: [B, T, D]; valid: bool [B, T]; cross_kv: projected encoder memory; self_mask,
        cross_mask: optional masks replacing the padding masks (packed sequences);
        head_masks: (self, cross), each [H], [B, H] or None (0 removes a head).
        Returns ([B, T, D], self weights [B, H, T, T] | None, cross weights [B, H, T, S] | None).
        """
        r = split_rng(dropout_rng, 6)
        y, self_w = self.self_block(
            y, lambda h: self.self_attention(h, valid, mask=self_mask, dropout_rng=r[0],
                                             return_weights=return_weights,
                                             head_mask=head_masks[0]),
            r[1],
        )
        y, cross_w = self.cross_block(
            y, lambda h: self.cross_attention(h, cross_kv, mask=cross_mask, dropout_rng=r[2],
                                              return_weights=return_weights,
                                              head_mask=head_masks[1]),
            r[3],
        )
        y, _ = self.feed_forward_block(y, lambda h: (self.feed_forward(h, r[4]), None), r[5])
        return y, self_w, cross_w

    def step(self, y, cache: KVCache, cross_kv: CrossKV, return_weights=False,
             head_masks=(None, None)):
        """One decoding step (no dropout).

        y: [B, 1, D]; head_masks: (self, cross) as in `__call__`. Returns ([B, 1, D], new
        cache, self weights [B, H, 1, T_max] | None, cross weights [B, H, 1, S] | None).
        """
        new_cache = [cache]

        def self_sublayer(h):
            out, new_cache[0], w = self.self_attention.step(
                h, cache, return_weights=return_weights, head_mask=head_masks[0])
            return out, w

        y, self_w = self.self_block(y, self_sublayer, None)
        y, cross_w = self.cross_block(
            y, lambda h: self.cross_attention(h, cross_kv, return_weights=return_weights,
                                              head_mask=head_masks[1]), None
        )
        y, _ = self.feed_forward_block(y, lambda h: (self.feed_forward(h, None), None), None)
        return y, new_cache[0], self_w, cross_w
