"""Attention masks.

Convention: a mask is a boolean array where True means "this query may attend to
this key". Every mask broadcasts to `[B, H, Tq, Tk]`; the helpers return arrays
with singleton axes where a dimension does not matter (e.g. `[B, 1, 1, Tk]`).
"""

from __future__ import annotations

import jax.numpy as jnp


def key_padding_mask(key_valid: jnp.ndarray) -> jnp.ndarray:
    """Mask out padded keys.

    Args:
      key_valid: bool [B, Tk], True for real tokens.
    Returns:
      bool [B, 1, 1, Tk].
    """
    return key_valid[:, None, None, :]


def padding_mask(query_valid: jnp.ndarray, key_valid: jnp.ndarray) -> jnp.ndarray:
    """Mask that is True only where both the query and the key are real tokens.

    Padded query rows become fully masked; the attention core turns such rows into
    all-zero weights (not NaN).

    Args:
      query_valid: bool [B, Tq]; key_valid: bool [B, Tk].
    Returns:
      bool [B, 1, Tq, Tk].
    """
    return query_valid[:, None, :, None] & key_valid[:, None, None, :]


def segment_mask(query_segments: jnp.ndarray, key_segments: jnp.ndarray) -> jnp.ndarray:
    """Packed sequences: a query may attend only to keys of its own segment.

    Args:
      query_segments: int [B, Tq]; key_segments: int [B, Tk]. Segment ids 1, 2, ...
        number the sequences packed in a row; 0 marks padding (never attended to).
    Returns:
      bool [B, 1, Tq, Tk]. Padded query rows are fully masked.
    """
    same = query_segments[:, None, :, None] == key_segments[:, None, None, :]
    return same & (key_segments > 0)[:, None, None, :]


def causal_mask(length: int, key_length: int | None = None, offset: int = 0) -> jnp.ndarray:
    """Lower-triangular mask: query i may attend to keys j <= i + offset.

    Args:
      length: number of queries Tq.
      key_length: number of keys Tk (defaults to Tq).
      offset: absolute position of query 0 (used when queries are a suffix of the keys).
    Returns:
      bool [1, 1, Tq, Tk].
    """
    key_length = length if key_length is None else key_length
    query_pos = jnp.arange(length)[:, None] + offset
    key_pos = jnp.arange(key_length)[None, :]
    return (key_pos <= query_pos)[None, None]


def combine_masks(*masks: jnp.ndarray | None) -> jnp.ndarray | None:
    """Logical AND of masks, skipping None; None if every mask is None.

    Returns:
      bool array broadcast to the common shape of the inputs (e.g. [B, 1, Tq, Tk]).
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    combined = present[0]
    for mask in present[1:]:
        combined = jnp.logical_and(combined, mask)
    return combined
