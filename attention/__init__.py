"""attnmt attention library: masks, scaled dot-product core, multi-head modules, KV caches.

Exports are imported lazily, so the map-file tools (`python -m attention.inspect`)
start without loading JAX and Flax.
"""

import importlib

_EXPORTS = {
    "CrossKV": "attention.cache", "KVCache": "attention.cache", "reorder_batch": "attention.cache",
    "attention_weights": "attention.core", "cached_attention": "attention.core",
    "dot_product_attention": "attention.core", "dropout": "attention.dropout",
    "causal_mask": "attention.masks", "combine_masks": "attention.masks",
    "key_padding_mask": "attention.masks", "padding_mask": "attention.masks",
    "segment_mask": "attention.masks",
    "CausalSelfAttention": "attention.modules", "CrossAttention": "attention.modules",
    "MultiHeadAttention": "attention.modules", "SelfAttention": "attention.modules",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'attention' has no attribute {name!r}")
