"""Key/value caches for incremental (token-by-token) decoding.

Both caches are plain pytrees, so they flow through `jax.jit`, `lax.while_loop`
and beam-search reordering (`reorder_batch`) without any module state.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    """Causal self-attention cache.

    key: [B, H, T_max, Dk]; value: [B, H, T_max, Dv] (head-major, the order a decoding
    step reads them in); index: int32 scalar, the number of positions already written
    (the position of the next token).
    """

    key: jnp.ndarray
    value: jnp.ndarray
    index: jnp.ndarray

    @classmethod
    def zeros(
        cls, batch: int, max_length: int, num_heads: int, key_dim: int, value_dim: int,
        dtype: jnp.dtype = jnp.float32,
    ) -> KVCache:
        """An empty cache for `max_length` positions."""
        return cls(
            key=jnp.zeros((batch, num_heads, max_length, key_dim), dtype),
            value=jnp.zeros((batch, num_heads, max_length, value_dim), dtype),
            index=jnp.zeros((), jnp.int32),
        )

    def append(self, key: jnp.ndarray, value: jnp.ndarray) -> KVCache:
        """Write one step. key: [B, 1, H, Dk]; value: [B, 1, H, Dv] (token-major, as projected)."""
        start = (0, 0, self.index, 0)
        key = jnp.swapaxes(key, 1, 2).astype(self.key.dtype)
        value = jnp.swapaxes(value, 1, 2).astype(self.value.dtype)
        return KVCache(
            key=jax.lax.dynamic_update_slice(self.key, key, start),
            value=jax.lax.dynamic_update_slice(self.value, value, start),
            index=self.index + 1,
        )

    def valid_mask(self) -> jnp.ndarray:
        """Keys written so far (including the current step): bool [1, 1, 1, T_max]."""
        return (jnp.arange(self.key.shape[2]) < self.index)[None, None, None, :]


class CrossKV(NamedTuple):
    """Encoder memory projected once per source for cross-attention.

    key: [B, S, H, Dk]; value: [B, S, H, Dv]; valid: bool [B, S] (non-pad source tokens).
    """

    key: jnp.ndarray
    value: jnp.ndarray
    valid: jnp.ndarray


def reorder_batch(tree, indices: jnp.ndarray):
    """Gather every batched leaf of a cache pytree along axis 0 (beam search reordering).

    Scalars (e.g. `KVCache.index`) are left as they are.

    Args:
      tree: any pytree of caches; indices: int32 [B'] rows to take.
    """
    return jax.tree.map(lambda x: x if x.ndim == 0 else jnp.take(x, indices, axis=0), tree)
