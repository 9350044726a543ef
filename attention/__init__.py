"""attnmt attention library: masks, scaled dot-product core, multi-head modules, KV caches."""

from attention.cache import CrossKV, KVCache, reorder_batch
from attention.core import attention_weights, dot_product_attention
from attention.masks import causal_mask, combine_masks, key_padding_mask, padding_mask
from attention.modules import (
    CausalSelfAttention,
    CrossAttention,
    MultiHeadAttention,
    SelfAttention,
)

__all__ = [
    "CausalSelfAttention", "CrossAttention", "CrossKV", "KVCache", "MultiHeadAttention",
    "SelfAttention", "attention_weights", "causal_mask", "combine_masks",
    "dot_product_attention", "key_padding_mask", "padding_mask", "reorder_batch",
]
