"""Scaled dot-product attention: softmax(Q Kᵀ / sqrt(d_k)) V.

Two paths with the same maths:
  * the reference path materialises the weights `[B, H, Tq, Tk]` and can return them;
  * the fused path calls `jax.nn.dot_product_attention` (XLA on CPU, cuDNN flash
    attention on GPU for bf16/fp16) and is used whenever weights are not requested.

Layout follows `jax.nn.dot_product_attention`: `[batch, length, heads, head_dim]`.
Logits and softmax are always computed in float32, whatever the compute dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attention.dropout import dropout

_MASKED_LOGIT = -1e30  # exp(-1e30 - max) underflows to exactly 0 in float32


def attention_weights(
    query: jnp.ndarray,
    key: jnp.ndarray,
    mask: jnp.ndarray | None = None,
) -> jnp.ndarray:
    """Softmax attention weights in float32.

    Args:
      query: [B, Tq, H, Dk]; key: [B, Tk, H, Dk].
      mask: bool broadcastable to [B, H, Tq, Tk]; True = may attend.
    Returns:
      float32 [B, H, Tq, Tk]. Masked keys get exactly 0; each row over its
      unmasked keys sums to 1; a row with no unmasked key is all zeros.
    """
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
    return _masked_softmax(logits / jnp.sqrt(jnp.float32(query.shape[-1])), mask)


def _masked_softmax(logits: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
    """float32 softmax over the last axis with masked entries exactly 0 (zero rows stay 0)."""
    if mask is None:
        return jax.nn.softmax(logits, axis=-1)
    weights = jax.nn.softmax(jnp.where(mask, logits, _MASKED_LOGIT), axis=-1)
    # A fully masked row would otherwise be uniform over masked keys.
    return jnp.where(mask, weights, 0.0)


def cached_attention(
    query: jnp.ndarray,
    key_cache: jnp.ndarray,
    value_cache: jnp.ndarray,
    mask: jnp.ndarray,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Attention of a few new queries over a head-major KV cache (incremental decoding).

    The cache is stored [B, H, T, D] so that each decoding step reads it as it lies;
    with the [B, T, H, D] layout of `dot_product_attention` every step would first copy
    the whole cache into that order.

    Args:
      query: [B, Tq, H, Dk]; key_cache: [B, H, T, Dk]; value_cache: [B, H, T, Dv];
      mask: bool broadcastable to [B, H, Tq, T].
    Returns:
      (output [B, Tq, H, Dv], weights float32 [B, H, Tq, T]).
    """
    logits = jnp.einsum("bqhd,bhkd->bhqk", query, key_cache, preferred_element_type=jnp.float32)
    weights = _masked_softmax(logits / jnp.sqrt(jnp.float32(query.shape[-1])), mask)
    out = jnp.einsum("bhqk,bhkd->bqhd", weights.astype(value_cache.dtype), value_cache)
    return out, weights


def _fused_implementation(dtype: jnp.dtype, implementation: str) -> str | None:
    """Pick the backend of `jax.nn.dot_product_attention` ("auto" -> cuDNN on GPU in half precision)."""
    if implementation == "auto":
        half = dtype in (jnp.bfloat16, jnp.float16)
        return "cudnn" if half and jax.default_backend() == "gpu" else None
    if implementation == "xla":
        return "xla"
    if implementation == "cudnn":
        return "cudnn"
    raise ValueError(f"unknown attention implementation {implementation!r} (auto, xla, cudnn, reference)")


def dot_product_attention(
    query: jnp.ndarray,
    key: jnp.ndarray,
    value: jnp.ndarray,
    mask: jnp.ndarray | None = None,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    return_weights: bool = False,
    implementation: str = "auto",
) -> tuple[jnp.ndarray, jnp.ndarray | None]:
    """Multi-head scaled dot-product attention.

    Args:
      query: [B, Tq, H, Dk]; key: [B, Tk, H, Dk]; value: [B, Tk, H, Dv] (Dv may differ from Dk).
      mask: bool broadcastable to [B, H, Tq, Tk]; True = may attend.
      dropout_rate: attention dropout on the weights; active only when `dropout_rng` is given.
      dropout_rng: PRNG key, or None for deterministic (eval) behaviour.
      return_weights: also return the (pre-dropout) weights.
      implementation: "auto" | "xla" | "cudnn" for the fused path, or "reference" to
        always materialise the weights.
    Returns:
      (output [B, Tq, H, Dv] in the dtype of `value`, weights float32 [B, H, Tq, Tk] or None).
      Rows with no valid key produce a zero output on both paths.
    """
    use_dropout = dropout_rng is not None and dropout_rate > 0.0
    fused_ok = (
        not return_weights
        and not use_dropout
        and implementation != "reference"
        and query.shape[-1] == value.shape[-1]  # jax.nn.dot_product_attention needs Dk == Dv
    )
    if fused_ok:
        if mask is not None:
            mask = jnp.broadcast_to(
                mask, (query.shape[0], mask.shape[1], query.shape[1], key.shape[1])
            )
        out = jax.nn.dot_product_attention(
            query, key, value, mask=mask,
            implementation=_fused_implementation(query.dtype, implementation),
        )
        if mask is not None:
            # Match the reference path on rows without any valid key: zeros, not a uniform mix.
            has_key = jnp.any(mask, axis=-1)  # [B, H, Tq]
            out = out * jnp.swapaxes(has_key, 1, 2)[..., None].astype(out.dtype)
        return out, None

    weights = attention_weights(query, key, mask)
    mixed = dropout(weights, dropout_rate, dropout_rng) if use_dropout else weights
    out = jnp.einsum("bhqk,bkhd->bqhd", mixed.astype(value.dtype), value)
    return out, (weights if return_weights else None)
