"""Dropout with keep masks from a counter-based integer hash.

`jax.random.bernoulli` draws one threefry-2x32 output (20 rounds of add/rotate/xor)
per element. On a CPU that is most of the cost of dropout: for the 4+4-layer
Transformer-tiny it was a quarter of a whole training step. Here one 32-bit threefry
draw per call seeds a cheap integer hash of the element index (two rounds of Chris
Wellons' "lowbias32" finaliser, a few multiplies and shifts each), and each 32-bit hash
gives two 16-bit lanes, each compared against the rate. The same key gives the same
mask; masks of different keys are independent for all practical purposes (tested:
keep fraction, lane uniformity, agreement of two keys, correlation of neighbours).

The drop probability is `rate` rounded to a multiple of 2**-16 (0.3 -> 0.299988...),
and kept values are scaled by the inverse of that exact keep probability, so
E[dropout(x)] = x holds exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_LANES = 65536  # 16-bit lanes: two per 32-bit hash
_GOLDEN = 0x9E3779B9  # odd constant spreading consecutive counters over the input space


def _lowbias32(x: jnp.ndarray) -> jnp.ndarray:
    """The "lowbias32" integer finaliser (uint32 -> uint32, a bijection)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def drop_threshold(rate: float) -> int:
    """Lanes below this (of 65,536) are dropped: round(rate * 65536), for 0 <= rate < 1."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
    return min(round(rate * _LANES), _LANES - 1)


def keep_mask(rng: jax.Array, rate: float, shape: tuple[int, ...]) -> jnp.ndarray:
    """Bernoulli keep mask: bool `shape`, True with probability 1 - drop_threshold(rate)/65536."""
    size = 1
    for dim in shape:
        size *= dim
    seeds = jax.random.bits(rng, (2,), jnp.uint32)
    counter = jax.lax.iota(jnp.uint32, (size + 1) // 2)
    hashed = _lowbias32(_lowbias32(counter * jnp.uint32(_GOLDEN) + seeds[0]) ^ seeds[1])
    lanes = jax.lax.bitcast_convert_type(hashed, jnp.uint16).reshape(-1)[:size]
    return (lanes >= drop_threshold(rate)).reshape(shape)


def dropout(x: jnp.ndarray, rate: float, rng: jax.Array | None) -> jnp.ndarray:
    """Inverted dropout of `x` (any shape); identity when `rng` is None or `rate` is 0."""
    if rng is None or rate == 0.0:
        return x
    threshold = drop_threshold(rate)
    scale = _LANES / (_LANES - threshold)
    return jnp.where(keep_mask(rng, rate, x.shape), x * jnp.asarray(scale, x.dtype), 0).astype(x.dtype)
